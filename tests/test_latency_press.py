"""KV-cache compression rows of `golinear latency` (bench/speed/latency_press.py): real kvpress presses on the
SmolLM2-135M shape through the sweep, the compressed cache they decode over, their bound columns, their one-line
errors, and their place beside (not inside) the target checks."""
from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("kvpress")
import torch  # noqa: E402

from golinear.bench.speed import latency  # noqa: E402
from golinear.bench.cli import main as cli  # noqa: E402

BUDGET, LENGTH, NEW = 64, 256, 4
SNAPKV, STREAMING = f"press=snapkv,kv_budget={BUDGET}", f"press=streaming_llm,kv_budget={BUDGET}"
CHUNKED = f"{SNAPKV},prefill_chunk=96"
LABELS = {SNAPKV: f"snapkv (kvpress) @{BUDGET}", STREAMING: f"streaming_llm (kvpress) @{BUDGET}",
          CHUNKED: f"snapkv (kvpress, chunked prefill 96) @{BUDGET}"}


def spied_load(monkeypatch, seen: list):
    """The sweep's own model, with a pre-hook on every attention layer that records (layer, query length, entries
    its cache holds before the step): what each forward of the real code path attends over."""
    load = latency._load

    def load_and_spy(*args, **kwargs):
        model = load(*args, **kwargs)
        for i, layer in enumerate(model.model.layers):
            def hook(module, args, kwargs, i=i):
                cache = kwargs.get("cache") or kwargs.get("past_key_values")
                held = cache.get_seq_length(i) if cache is not None and len(cache.layers) > i else 0
                seen.append((i, kwargs["hidden_states"].shape[1], held))
            layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True)
        return model
    monkeypatch.setattr(latency, "_load", load_and_spy)


def test_press_rows_through_the_sweep(tmp_path, monkeypatch):
    """Three press rows (two presses, one compressing after every prefill chunk) at batch 1 and 2, then full
    attention on the same prompts: every decode step attends over exactly kv_budget + i entries per layer,
    the chunked prefill never holds more than the budget plus a chunk, and each row's timings and decode bytes
    (the weights + the compressed cache, by hand) are filled."""
    seen = []
    spied_load(monkeypatch, seen)
    common = ["--lengths", str(LENGTH), "--batch", "1,2", "--new-tokens", str(NEW), "--layers", "2",
              "--out-dir", str(tmp_path)]
    assert cli(["latency", "--configs", ";".join(LABELS), "--press-decoder", "dynamic", *common]) == 0
    for layer in (0, 1):  # the DynamicCache cross-check runs every step through the attention layers
        steps = [held for i, q, held in seen if i == layer and q == 1]  # the last prompt token, then decode
        runs = [steps[k:k + NEW + 1] for k in range(0, len(steps), NEW + 1)]
        assert len(runs) >= 6 and all(r == list(range(BUDGET - 1, BUDGET + NEW)) for r in runs), runs
        prefill = [held for i, q, held in seen if i == layer and q > 1]
        assert max(prefill) == BUDGET - 1  # the chunked prefill's chunks start from the compressed cache
    monkeypatch.undo()
    assert cli(["latency", "--configs", ";".join(LABELS), *common]) == 0  # the static decoder (full-static's)
    assert cli(["latency", "--configs", "full", *common]) == 0

    df = pd.read_csv(tmp_path / "latency.csv")
    assert len(df) == 14 and (df.status == "ok").all() and (df.new_tokens == NEW).all()
    press = df[df.press.notna()]
    dynamic = {f"{label}, DynamicCache decode" for label in LABELS.values()}
    assert set(press.config) == set(LABELS.values()) | dynamic and (press.kv_budget == BUDGET).all()
    assert all(("HF's DynamicCache" in n) == (c in dynamic) for c, n in zip(press.config, press.note))
    assert set(press.press) == {"snapkv", "streaming_llm"}
    assert press[press.config == LABELS[CHUNKED]].prefill_chunk.tolist() == [96, 96]
    for col in ["prefill_s", "decode_ms_per_token", "e2e_s", *latency.BOUND_COLUMNS]:
        assert (df[col] > 0).all(), col
    assert (df.peak_gib > 0).all()  # on the CPU: the process's peak resident set
    h, f, kv = 576, 1536, 3 * 64
    weights = 2 * 4 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 4 * (49152 * h + h)
    for _, r in df.iterrows():
        held = BUDGET if r.config != "full" else LENGTH  # the compressed cache; full: the prompt
        want = weights + 4 * r.batch * h + 2 * 2 * 4 * r.batch * (held + (NEW + 1) / 2) * kv
        assert r.decode_bytes_per_step == pytest.approx(want, rel=1e-5), r.config
    assert all(f"from {BUDGET} entries" in n and f"kv_budget {BUDGET}" in n for n in press.note)
    md = (tmp_path / "latency.md").read_text()
    assert all(f"{label} prefill s" in md for label in LABELS.values()) and "full prefill s" in md
    assert md.count(f"- {LABELS[CHUNKED]} at {LENGTH}: ") == 2  # its note, once per batch table
    assert "against the fastest full-attention row" not in md  # no linearized row here; the presses are none


@pytest.mark.parametrize("press", ["snapkv", "adakv_snapkv", "kvzip"])
@pytest.mark.parametrize("decoder", ["static", "dynamic"])
def test_press_row_decodes_what_the_press_generation_decodes(decoder, press):
    """The latency row's greedy steps, on either decoder, are the press generation's (models.kv_compression.generate,
    with the last prompt token as the question) on the same prompt: the timed run does the same work. Head-adaptive
    presses (AdaKV; KVzip, whose reconstruction passes run inside the timed prefill) count the entries per head
    their layers hold in all."""
    from golinear.bench.speed.latency_press import PressRun
    from golinear.bench.run.specs import parse_model_spec
    from golinear.models.backbones.backbone import random_backbone
    from golinear.models.kv_compression.generate import generate
    model = random_backbone("smollm2-135m")
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    ids = torch.randint(0, model.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    spec = parse_model_spec(f"press={press},kv_budget={BUDGET}")
    tokens = []
    lm_head = model.lm_head
    model.lm_head = torch.nn.Sequential(lm_head, Recorder(tokens))
    run = PressRun(model, spec, NEW, decoder=decoder)
    run(ids)
    model.lm_head = lm_head
    want = generate(model, ids[0].tolist(), 1, press, BUDGET, NEW + 1)
    assert run.entries == BUDGET and tokens == want


class Recorder(torch.nn.Module):
    """Passes logits through and records each step's greedy token."""

    def __init__(self, tokens: list):
        super().__init__()
        self.tokens = tokens

    def forward(self, logits):
        self.tokens.append(int(logits[0, -1].argmax()))
        return logits


@pytest.mark.parametrize("config,lengths,needle", [
    ("press=nope,kv_budget=64", "256", "unknown press 'nope'"),
    ("press=snapkv", "256", "needs kv_budget=<KV entries kept per layer and KV head>"),
    ("press=snapkv,kv_budget=1", "256", "at least 2"),
    ("press=snapkv,kv_budget=-8", "256", "kv_budget"),
    ("press=snapkv,kv_budget=lots", "256", "kv_budget"),
    ("kv_budget=64", "256", "needs press=<name>"),
    ("press=snapkv,kv_budget=16", "48", "more than 64 tokens"),
    ("press=snapkv,kv_budget=64,prefill_chunk=64", "256", "more than 64 tokens"),
    ("press=knorm,kv_budget=64,question_aware=true", "256", "question_aware=true"),
])
def test_press_bad_input_is_one_line_before_any_model(config, lengths, needle, tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")
    monkeypatch.setattr(latency, "_load", no_model)
    assert cli(["latency", "--configs", f"full;{config}", "--lengths", lengths, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "latency.csv").exists()


def test_press_rows_are_neither_baselines_nor_targets():
    """A press row faster than every full-attention row is not the baseline the targets are taken against, and
    it is not checked against the targets itself (nor listed against the fastest full attention)."""
    from golinear.bench.speed.latency_targets import against_fastest_full, target_checks
    base = dict(model="m", weights="random", dtype="bfloat16", device="gpu", batch=8, status="ok")
    table = {"full": (2.0, 40.0, 30.0, None), "full-static": (2.0, 20.0, 30.0, None),
             "gdn-default": (1.0, 10.0, 12.0, None), "snapkv (kvpress) @1024": (0.1, 1.0, 1.0, "snapkv")}
    rows = [dict(base, config=c, length=L, prefill_s=p, decode_ms_per_token=d * (1 + L / 1e5), peak_gib=m, press=pr,
                 decode_vs_bound=1.5)
            for c, (p, d, m, pr) in table.items() for L in (1024, 4096)]
    df = pd.DataFrame(rows)
    checks = target_checks(df).set_index("target")
    assert set(checks.config) == {"gdn-default"}
    assert checks.loc["decode speed-up vs the fastest full attention", "value"] == "2.00x at 4096"
    assert checks.loc["peak memory vs the smallest full attention", "value"] == "0.40x at 4096"
    t = against_fastest_full(df)
    assert set(t.config) == {"gdn-default"} and set(t.decode_vs) == {"full-static"}
    assert target_checks(df.drop(columns="press")).config.eq("snapkv (kvpress) @1024").any()  # (the column decides)


def test_a_press_rows_decode_is_held_to_gdn_defaults_distance_from_the_bound():
    """The press target: its decode/bound at most 0.15 above gdn-default's in the same group, judged at the length
    where the press is furthest behind; a group without gdn-default, or a CPU group, gets no such row."""
    from golinear.bench.speed.latency_targets import checks_markdown, press_checks
    base = dict(model="m", weights="random", dtype="bfloat16", batch=1, status="ok", prefill_s=1.0,
                decode_ms_per_token=8.0, peak_gib=16.0)
    bound = {("gdn-default", 4096): 1.60, ("gdn-default", 32768): 1.62, ("kvzip (kvpress) @1024", 4096): 1.66,
             ("kvzip (kvpress) @1024", 32768): 1.80, ("lagkv (kvpress) @1024", 4096): 1.70,
             ("lagkv (kvpress) @1024", 32768): 1.64}
    rows = [dict(base, device=dev, config=c, length=L, decode_vs_bound=v, press=None if c == "gdn-default" else "p")
            for dev in ("H100", "cpu") for (c, L), v in bound.items()]
    rows += [dict(base, device="H200", config="kvzip (kvpress) @1024", length=4096, decode_vs_bound=3.0, press="p")]
    checks = press_checks(pd.DataFrame(rows)).set_index("config")
    assert list(checks.device) == ["H100", "H100"]
    assert checks.loc["kvzip (kvpress) @1024", "value"] == "+0.18 at 32768"
    assert checks.loc["kvzip (kvpress) @1024", "met"] == "not met"
    assert (checks.loc["lagkv (kvpress) @1024", "value"], checks.loc["lagkv (kvpress) @1024", "met"]) == (
        "+0.10 at 4096", "met")
    assert "decode/bound minus gdn-default's" in "\n".join(checks_markdown(pd.DataFrame(rows)))
