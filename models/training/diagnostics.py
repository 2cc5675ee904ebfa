"""`golinear diagnose`: how well linear replacements approximate the frozen attention (paper §3.3, App. B.1).

Per linearized layer l, on held-out text, both outputs are computed from the SAME layer input (the hidden
state the linearized model actually feeds that layer), before o_proj, per query head:
  - nMSE(l) = mean over (t, h, d) of (y_full - y_lin)^2 / Var(y_full(l))   [Var over the sequence's T x H x D]
    layerwise (mean over t, h) and tokenwise (mean over l, h at each position t);
  - y_full = causal softmax attention with the frozen q/k/v projections (no short conv, no LoRA), RoPE applied.
Key geometry per layer and KV head, from those frozen post-RoPE keys k_i:
  - k~_i = k_i / (|k_i| + eps), kbar_t = (1/t) sum_{i<=t} k~_i (running mean of normalised keys);
  - key concentration C_t = cos(k~_t, kbar_t);
  - projection residual R_t = |(k~_t - kbar_t) - (I - P_t) k~_t| = |P_t k~_t - kbar_t|,
    P_t = kbar_t kbar_t^T / (|kbar_t|^2 + eps)  (App. A.2: equals |cos(alpha_t) - |kbar_t|| for unit keys).
C_t, R_t are averaged over sequences, layers and heads; nMSE is binned by C and by R (each query head takes
its KV head's C and R). Before training = the same linearization freshly initialised with the run's seed.
Hardness per layer (for `--keep-full F --select hardness`): z(mean R) - z(mean C) over layers of the
full-attention backbone (high residual, low concentration = hard); written as `layer_scores.json`.
"""
from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from golinear.models.attention.layers import lora_disabled
from golinear.models.attention.ops.key_stats import normalize_keys, running_mean  # noqa: F401  (diagnostics' names for them too)

C_EDGES = np.linspace(-1.0, 1.0, 21)
R_EDGES = np.linspace(0.0, 1.0, 21)  # R <= 1 + |kbar| <= 2; values above the last edge go in the last bin


# ---------------------------------------------------------------------------------------------- metric math
def key_concentration(k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """C_t = cos(k~_t, kbar_t). k [B, T, H, D] -> [B, T, H]."""
    kt = normalize_keys(k.float(), eps)
    kbar = running_mean(kt, dim=1)
    return (kt * kbar).sum(-1) / (kt.norm(dim=-1) * kbar.norm(dim=-1) + eps)


def projection_residual(k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """R_t = |P_t k~_t - kbar_t| (mean subtraction vs projection orthogonal to kbar). [B,T,H,D] -> [B,T,H]."""
    kt = normalize_keys(k.float(), eps)
    kbar = running_mean(kt, dim=1)
    coef = (kt * kbar).sum(-1, keepdim=True) / (kbar.pow(2).sum(-1, keepdim=True) + eps)
    return (coef * kbar - kbar).norm(dim=-1)


def nmse_token_head(y_full: torch.Tensor, y_lin: torch.Tensor) -> torch.Tensor:
    """Per (sequence, position, head) squared error over D, normalised by Var(y_full) of that sequence.

    y [B, T, H, D] -> [B, T, H]; its mean over (T, H) is the layer's nMSE = MSE / Var(y_full)."""
    yf, yl = y_full.float(), y_lin.float()
    var = yf.reshape(yf.shape[0], -1).var(dim=1, unbiased=False).clamp_min(1e-12)
    return (yf - yl).pow(2).mean(-1) / var.view(-1, 1, 1)


def binned_mean(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> dict:
    """Mean of y in bins of x (values outside the edges go to the end bins)."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    idx = np.clip(np.digitize(x, edges[1:-1]), 0, len(edges) - 2)
    counts = np.bincount(idx, minlength=len(edges) - 1)
    sums = np.bincount(idx, weights=y, minlength=len(edges) - 1)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return {"edges": [float(e) for e in edges], "centers": [float(c) for c in (edges[:-1] + edges[1:]) / 2],
            "count": [int(c) for c in counts], "nmse": [None if math.isnan(m) else float(m) for m in means]}


def zscore(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def hardness_scores(mean_c, mean_r) -> list[float]:
    """Per-layer hardness: z(R) - z(C) across layers (higher = harder to linearize)."""
    return [float(v) for v in zscore(mean_r) - zscore(mean_c)]


def causal_attention(q, k, v, scale: float) -> torch.Tensor:
    """Plain causal softmax attention, GQA aware. q [B,T,H,D], k/v [B,T,Hkv,D] -> [B,T,H,D] (fp32)."""
    groups = q.shape[2] // k.shape[2]
    qh = q.float().transpose(1, 2)
    kh = k.float().repeat_interleave(groups, dim=2).transpose(1, 2)
    vh = v.float().repeat_interleave(groups, dim=2).transpose(1, 2)
    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale).transpose(1, 2)


# ---------------------------------------------------------------------------------------------- model hooks
def frozen_qkv(attn, x: torch.Tensor, position_embeddings):
    """q [B,T,H,D], k, v [B,T,Hkv,D] from the frozen projections (+ q/k norm, RoPE), no conv, no LoRA
    (models.attention.projection: a linearized layer's fused form, a full-attention layer's own)."""
    from golinear.models.attention.projection import project_qkv

    with lora_disabled(attn):
        _, q, k, v, _ = project_qkv(attn, x, position_embeddings, fused=hasattr(attn, "project"))
        return q, k, v


class Collector:
    """Forward hooks that record per-layer key geometry and (for linearized layers) nMSE per token/head."""

    def __init__(self, model, with_nmse: bool):
        self.model, self.with_nmse = model, with_nmse
        self.records: dict[int, dict[str, list]] = {}
        self._pending_lin: dict[int, torch.Tensor] = {}
        self._handles = []

    def __enter__(self):
        from golinear.models.attention.projection import decoder_layers
        for idx, layer in enumerate(decoder_layers(self.model)):
            attn = layer.self_attn
            self._handles.append(attn.register_forward_pre_hook(self._attn_hook(idx), with_kwargs=True))
            if self.with_nmse and hasattr(attn, "project"):
                self._handles.append(attn.o_proj.register_forward_pre_hook(self._o_proj_hook(idx)))
                self._handles.append(attn.register_forward_hook(self._after_hook(idx)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()

    def _attn_hook(self, idx):
        def hook(module, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            pe = kwargs.get("position_embeddings")
            with torch.no_grad():
                q, k, v = frozen_qkv(module, x, pe)
                rec = self.records.setdefault(idx, {"C": [], "R": [], "nmse": []})
                rec["C"].append(key_concentration(k).cpu())
                rec["R"].append(projection_residual(k).cpu())
                if self.with_nmse and hasattr(module, "project"):
                    rec["_full"] = causal_attention(q, k, v, module.scaling)
        return hook

    def _o_proj_hook(self, idx):
        def hook(module, args):
            self._pending_lin[idx] = args[0].detach()
        return hook

    def _after_hook(self, idx):
        def hook(module, args, output):
            rec = self.records[idx]
            y_full = rec.pop("_full")
            y_lin = self._pending_lin.pop(idx).reshape(y_full.shape)
            rec["nmse"].append(nmse_token_head(y_full, y_lin).cpu())
        return hook


@torch.no_grad()
def collect(model, sequences: torch.Tensor, with_nmse: bool, device="cpu") -> dict[int, dict[str, torch.Tensor]]:
    """Run the sequences one at a time; per layer C, R [N, T, Hkv] and (linear layers) nMSE [N, T, H]."""
    model.eval()
    with Collector(model, with_nmse) as col:
        for seq in sequences:
            model(input_ids=seq.unsqueeze(0).to(device), use_cache=False)
    return {idx: {k: torch.cat(v) for k, v in rec.items() if v} for idx, rec in col.records.items()}


# ---------------------------------------------------------------------------------------------- summaries
def summarize_geometry(records: dict) -> dict:
    layers = sorted(records)
    C = torch.stack([records[i]["C"] for i in layers])  # [L, N, T, Hkv]
    R = torch.stack([records[i]["R"] for i in layers])
    mean_c = C.mean(dim=(1, 2, 3)).tolist()
    mean_r = R.mean(dim=(1, 2, 3)).tolist()
    return {"layers": layers, "C_t": C.mean(dim=(0, 1, 3)).tolist(), "R_t": R.mean(dim=(0, 1, 3)).tolist(),
            "C_layer": mean_c, "R_layer": mean_r, "hardness": hardness_scores(mean_c, mean_r)}


def summarize_nmse(records: dict) -> dict:
    """Layerwise and tokenwise nMSE plus nMSE binned by C and by R (query heads take their KV head's C/R)."""
    layers = sorted(i for i in records if "nmse" in records[i])
    if not layers:
        return {"layers": [], "layerwise": [], "tokenwise": [], "mean": None}
    e = torch.stack([records[i]["nmse"] for i in layers])  # [L, N, T, H]
    groups = e.shape[-1] // records[layers[0]]["C"].shape[-1]
    C = torch.stack([records[i]["C"] for i in layers]).repeat_interleave(groups, dim=-1)
    R = torch.stack([records[i]["R"] for i in layers]).repeat_interleave(groups, dim=-1)
    return {"layers": layers, "layerwise": e.mean(dim=(1, 2, 3)).tolist(), "tokenwise": e.mean(dim=(0, 1, 3)).tolist(),
            "mean": float(e.mean()), "by_C": binned_mean(C.numpy(), e.numpy(), C_EDGES),
            "by_R": binned_mean(R.numpy(), e.numpy(), R_EDGES)}


# ---------------------------------------------------------------------------------------------- plots
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path):
    from golinear.models.util.atomic import atomic_path
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def plot_nmse(runs: dict, out: Path) -> list[Path]:
    """Fig. 2b (layerwise) and 2c (tokenwise): solid after training, dashed before."""
    plt = _plt()
    paths = []
    for key, xlabel, fname in (("layerwise", "layer", "fig2b_layerwise_nmse.png"),
                               ("tokenwise", "token position", "fig2c_tokenwise_nmse.png")):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for (name, run), color in zip(runs.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4):
            for stage, ls in (("after", "-"), ("before", "--")):
                res = run.get(stage)
                if res and res[key]:
                    x = res["layers"] if key == "layerwise" else list(range(len(res[key])))
                    ax.plot(x, res[key], ls=ls, color=color, lw=1.2, label=f"{name} ({stage})")
        ax.set_yscale("log")
        if key == "tokenwise":
            ax.set_xscale("symlog", linthresh=8)
            ax.set_xlim(left=0)  # positions start at 0 (symlog would show an empty negative half)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("normalized MSE")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        _save(fig, out / fname)
        plt.close(fig)
        paths.append(out / fname)
    return paths


def plot_geometry(geometry: dict, runs: dict, out: Path) -> Path:
    """Fig. 3: nMSE binned by R and by C (top) and R_t, C_t against position (bottom)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(9.0, 6.4))
    for col, metric in enumerate(("R", "C")):
        ax = axes[0, col]
        for name, run in runs.items():
            res = run.get("after") or run.get("before")
            if res and res.get(f"by_{metric}"):
                b = res[f"by_{metric}"]
                xs = [c for c, m in zip(b["centers"], b["nmse"]) if m is not None]
                ys = [m for m in b["nmse"] if m is not None]
                ax.plot(xs, ys, marker="o", ms=3, lw=1.0, label=name)
        ax.set_yscale("log")
        ax.set_xlabel({"R": "projection residual R", "C": "key concentration C"}[metric])
        ax.set_ylabel("normalized MSE")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1, col]
        curve = geometry[f"{metric}_t"]
        ax.plot(range(len(curve)), curve, lw=1.0)
        ax.set_xscale("symlog", linthresh=8)
        ax.set_xlim(left=0)
        ax.set_xlabel("token position t")
        ax.set_ylabel(f"{metric}_t (mean over seq, layers, heads)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "fig3_residual_concentration.png"
    _save(fig, path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- CLI
def _heldout(args, tokenizer) -> tuple[torch.Tensor, dict]:
    from golinear.models.training import data as data_mod
    if args.sequences < 1 or args.seq_len < 2:
        raise ValueError(f"--sequences {args.sequences} / --seq-len {args.seq_len}: need >= 1 and >= 2")
    if args.tokens:
        td = data_mod.TokenData.load(args.tokens)
        if td.meta.get("tokenizer_fingerprint") != data_mod.tokenizer_fingerprint(tokenizer):
            raise ValueError(f"token file {args.tokens!r} was made with another tokenizer")
    else:
        td = data_mod.prepare_books(tokenizer, args.data_dir, train_tokens=0, heldout_docs=args.heldout_docs,
                                    heldout_tokens=args.sequences * args.seq_len)
    seqs = data_mod.heldout_sequences(td.heldout, args.seq_len, args.sequences)
    return seqs, {k: td.meta.get(k) for k in ("source", "heldout_rule", "heldout_ids", "tokenizer")}


def _parse_fresh(spec: str) -> dict:
    """--fresh mechanism[:window[:sinks]] -> linearize options, every value checked by the one schema (models.spec)."""
    from golinear.models.spec import ModelSpec
    parts = spec.split(":")
    try:
        if len(parts) > 3:
            raise ValueError("expected mechanism[:window[:sinks]]")
        return ModelSpec(**dict(zip(("mechanism", "window", "sinks"), parts))).linearize_options()
    except ValueError as e:
        raise ValueError(f"--fresh {spec!r}: {e}") from None


def main(args) -> int:
    from golinear.models.backbones.backbone import fingerprint, load_backbone
    from golinear.models.checkpoint.weights import apply_checkpoint, read_config
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    from golinear.models.training.train_utils import atomic_write_json, seed_everything

    from golinear.models.spec import check_checkpoint_files
    from golinear.models.spec.backbone_checks import check_linearize
    # every value is checked before any model loads or any file is written
    if args.sequences < 1 or args.seq_len < 2:
        raise ValueError(f"--sequences {args.sequences} / --seq-len {args.seq_len}: need >= 1 and >= 2")
    fresh = {spec: _parse_fresh(spec) for spec in args.fresh}
    for cfg in fresh.values():
        check_linearize(cfg, args.base)
    for folder in args.checkpoint:
        check_checkpoint_files(folder)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base, tok = load_backbone(args.base, dtype="float32", device="cpu")
    base_fp = fingerprint(base)
    seqs, held_meta = _heldout(args, tok)

    geometry = summarize_geometry(collect(base.to(device), seqs, with_nmse=False, device=device))
    n_layers = base.config.num_hidden_layers
    ranking = sorted(range(n_layers), key=lambda i: (-geometry["hardness"][i], i))
    scores = {"layer_scores": geometry["hardness"], "ranking_hardest_first": ranking,
              "signal": "z(mean projection residual R) - z(mean key concentration C) over layers",
              "base": args.base, "base_fingerprint": base_fp, "sequences": int(seqs.shape[0]),
              "seq_len": int(seqs.shape[1])}
    atomic_write_json(out / "layer_scores.json", scores)

    def fresh_model(cfg_dict: dict, seed: int):
        model, _ = load_backbone(args.base, dtype="float32", device="cpu")
        seed_everything(seed)
        return linearize(model, LinearizeConfig.from_dict(cfg_dict), base_name=args.base)

    runs = {}
    for folder in args.checkpoint:
        config = read_config(folder)
        seed = args.seed if args.seed is not None else config.get("training", {}).get("train", {}).get("seed", 0)
        before = summarize_nmse(collect(fresh_model(config["linearize"], seed).to(device), seqs, True, device))
        model, _ = load_backbone(args.base, dtype="float32", device="cpu")
        apply_checkpoint(model, folder, base_fingerprint=base_fp)
        after = summarize_nmse(collect(model.to(device), seqs, True, device))
        runs[Path(folder).name] = {"checkpoint": str(folder), "linearize": config["linearize"], "seed": seed,
                                   "before": before, "after": after}
        del model
    for spec, cfg in fresh.items():
        seed = args.seed if args.seed is not None else 0
        runs[f"{spec} (untrained)"] = {"linearize": cfg, "seed": seed,
                                       "before": summarize_nmse(collect(fresh_model(cfg, seed).to(device), seqs,
                                                                        True, device))}
    argv = sys.argv[1:] if sys.argv[1:2] == ["diagnose"] else ["diagnose"]  # the CLI's words (not pytest's)
    result = {"command": "golinear " + shlex.join(argv), "base": args.base, "base_fingerprint": base_fp, "heldout": held_meta,
              "sequences": int(seqs.shape[0]), "seq_len": int(seqs.shape[1]), "device": str(device),
              "geometry_full_attention": geometry, "layer_scores_file": str(out / "layer_scores.json"), "runs": runs}
    atomic_write_json(out / "diagnostics.json", result)
    plots = [plot_geometry(geometry, runs, out)]
    if runs:
        plots += plot_nmse(runs, out)
    summary = {name: {stage: run[stage]["mean"] for stage in ("before", "after") if stage in run}
               for name, run in runs.items()}
    print(json.dumps({"out": str(out), "mean_nmse": summary, "hardest_layers": ranking[:5],
                      "plots": [str(p) for p in plots]}))
    return 0
