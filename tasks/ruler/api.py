"""Task table and the python API: build_samples() makes RULER samples, score() applies RULER's metric."""
from __future__ import annotations

import time
from dataclasses import dataclass

from .aggregation import CommonWords, FrequentWords, VariableTracking
from .constants import METRIC, RECIPES
from .metrics import METRIC_FUNCTIONS, postprocess_pred
from .niah import NIAH
from .qa import QA
from .resources import hotpot_path, resolve_data_dir, squad_path

MIN_SEQ_LENGTH, MAX_SEQ_LENGTH = 1024, 32768
DEFAULT_SEQ_LENGTH, DEFAULT_NUM_SAMPLES, DEFAULT_SEED = 4096, 500, 42
EVALUATION_SEED = DEFAULT_SEED  # the prompts every published S-NIAH / RULER number is measured on (RULER's seed)
TUNING_SEED = 1  # what probes, slot censuses and scorer fits draw their prompts and values from instead


def check_tuning_seed(seed: int, what: str) -> int:
    """A seed for fitting or choosing something: any but the evaluation's, so nothing is tuned on the test prompts."""
    if seed == EVALUATION_SEED:
        raise ValueError(f"{what} {seed} is the evaluation prompts' seed; fit and probe on another seed "
                         f"(default {TUNING_SEED})")
    return seed


@dataclass(frozen=True)
class RulerTask:
    name: str      # lm-eval task name
    display: str   # short name in tables
    ruler: str     # RULER's task name (scripts/synthetic.yaml)
    needle_value: str | None = None  # a needle value type other than the RULER recipe's (S-NIAH by value type)

    @property
    def family(self) -> str:
        return RECIPES[self.ruler][0]

    @property
    def recipe(self) -> tuple[str, dict]:
        """(family, generator arguments): RULER's recipe, with the needle value type replaced where one is set."""
        family, args = RECIPES[self.ruler]
        return family, ({**args, "type_needle_v": self.needle_value} if self.needle_value else dict(args))

    @property
    def value_type(self) -> str | None:
        """The needles' value type (numbers, words, uuids) of a needle task; None for the others."""
        return self.recipe[1].get("type_needle_v")

    @property
    def metric(self) -> str:
        return METRIC[self.family]


_TASK_LIST = [
    RulerTask("golinear_sniah_1", "S-NIAH-1", "niah_single_1"),
    RulerTask("golinear_sniah_2", "S-NIAH-2", "niah_single_2"),
    RulerTask("golinear_sniah_3", "S-NIAH-3", "niah_single_3"),
    RulerTask("golinear_ruler_mk", "MK", "niah_multikey_1"),
    RulerTask("golinear_ruler_mq", "MQ", "niah_multiquery"),
    RulerTask("golinear_ruler_mv", "MV", "niah_multivalue"),
    RulerTask("golinear_ruler_cwe", "CWE", "cwe"),
    RulerTask("golinear_ruler_fwe", "FWE", "fwe"),
    RulerTask("golinear_ruler_hqa", "HQA", "qa_2"),
    RulerTask("golinear_ruler_sqa", "SQA", "qa_1"),
    RulerTask("golinear_ruler_vt", "VT", "vt"),
    # S-NIAH-1 (noise) and S-NIAH-2 (essays) with the value types RULER's niah.py defines that their recipes do not
    # use (essays with UUIDs is S-NIAH-3): for scorers fitted to one value type, tested on the others
    RulerTask("golinear_sniah_words_1", "S-NIAH-1 words", "niah_single_1", "words"),
    RulerTask("golinear_sniah_uuids_1", "S-NIAH-1 UUIDs", "niah_single_1", "uuids"),
    RulerTask("golinear_sniah_words_2", "S-NIAH-2 words", "niah_single_2", "words"),
]
NEEDLE_VALUE_TYPES = ("numbers", "words", "uuids")  # RULER niah.py's generate_random kinds
TASKS = {t.name: t for t in _TASK_LIST}
DISPLAY_NAMES = {t.name: t.display for t in _TASK_LIST}
SUITES = {"sniah": [t.name for t in _TASK_LIST[:3]], "ruler": [t.name for t in _TASK_LIST[3:11]],
          "sniah_values": [t.name for t in _TASK_LIST[11:]]}
GROUPS = {"sniah": "golinear_sniah", "ruler": "golinear_ruler_ext", "sniah_values": "golinear_sniah_values"}
GENERATORS = {'niah': NIAH, 'variable_tracking': VariableTracking, 'common_words_extraction': CommonWords,
              'freq_words_extraction': FrequentWords, 'qa': QA}


def resolve_task(task: str) -> RulerTask:
    """Accepts the lm-eval name, the short display name or RULER's own name."""
    for t in _TASK_LIST:
        if task in (t.name, t.display, t.ruler):
            return t
    raise ValueError(f"unknown RULER task {task!r}; allowed: {list(TASKS)} "
                     f"(or {[t.display for t in _TASK_LIST]}, or RULER names {[t.ruler for t in _TASK_LIST]})")


def _as_int(value, what: str, allowed: str, low: int | None = None, high: int | None = None) -> int:
    """Integers, or their decimal strings (CLI metadata); anything else is a ValueError naming it."""
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        n = int(value)
    if n is None or (low is not None and n < low) or (high is not None and n > high):
        raise ValueError(f"{what} {value!r} not allowed; use {allowed}")
    return n


def check_seq_length(max_seq_length) -> int:
    return _as_int(max_seq_length, "max_seq_length",
                   f"an integer from {MIN_SEQ_LENGTH} to {MAX_SEQ_LENGTH} (tokens, prompt + generation)",
                   MIN_SEQ_LENGTH, MAX_SEQ_LENGTH)


def build_samples(task: str, tokenizer, max_seq_length: int = DEFAULT_SEQ_LENGTH,
                  num_samples: int = DEFAULT_NUM_SAMPLES, seed: int = DEFAULT_SEED,
                  data_dir=None) -> list[dict]:
    """RULER samples for `task`, sized with `tokenizer` so prompt + max_gen_toks <= max_seq_length.

    `tokenizer` is a HF tokenizer or a name for models.backbones.backbone.load_tokenizer. Each row has `input`
    (RULER's input, without the answer prefix), `answer_prefix`, `prompt` (= input + answer_prefix,
    what the model continues), `outputs` (references), `max_gen_toks`, `length` (prompt tokens +
    max_gen_toks), `metric`, and where the needles sit: `needles`, `positions` (sentence / line /
    document index), `depths` (percent) and `haystack_size`. HQA returns at most 100 rows here.
    """
    spec = resolve_task(task)
    max_seq_length = check_seq_length(max_seq_length)
    num_samples = _as_int(num_samples, "num_samples", "a positive integer", 1)
    seed = _as_int(seed, "seed", "an integer")
    if isinstance(tokenizer, str):
        from golinear.models.backbones.backbone import load_tokenizer
        tokenizer = load_tokenizer(tokenizer)
    family, args = spec.recipe
    generator = GENERATORS[family](tokenizer, max_seq_length, seed, resolve_data_dir(data_dir), **args)
    rows = generator.samples(num_samples)
    for row in rows:
        row.update(task=spec.name, ruler_task=spec.ruler, metric=spec.metric, seed=seed)
        row.setdefault("needles", [])
        row.setdefault("positions", [])
        row.setdefault("depths", [])
    return rows


def score(task: str, predictions: list[str], references: list[list[str]]) -> float:
    """RULER's score for `task` (0-100, rounded to 2 places), after RULER's prediction clean-up."""
    spec = resolve_task(task)
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"need as many predictions as references, at least one "
                         f"(got {len(predictions)} and {len(references)})")
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    return METRIC_FUNCTIONS[spec.metric]([postprocess_pred(p) for p in predictions], refs)


def data_files(task: str, data_dir=None) -> list:
    """The local files `task` reads (for provenance hashes); FileNotFoundError if one is missing."""
    spec = resolve_task(task)
    folder = resolve_data_dir(data_dir)
    family, args = RECIPES[spec.ruler]
    if args.get('type_haystack') == 'essay':
        files = sorted((folder / "paul_graham_essays").glob("*.txt"))
        if not files:
            from golinear.models.util.data_dir import missing_data
            raise missing_data(folder, "paul_graham_essays/*.txt", f"{task} (its haystack: Paul Graham's essays)")
        return files
    if family == 'qa':
        return [squad_path(folder) if args['dataset'] == 'squad' else hotpot_path(folder)]
    return []


def check_data(tasks: list[str], data_dir=None) -> None:
    """Fail early, naming the missing file, before any model work starts."""
    for task in tasks:
        data_files(task, data_dir)
