"""The options of `golinear train` and `golinear diagnose`, apart from the commands (models.training.train_cli,
models.training.diagnostics) so that `golinear train --help` builds its parser without torch; bench.cli imports
a command's module only to run it. One function per command, taking the subparser.
"""
from __future__ import annotations

import argparse

from golinear.models.spec import CONV_ON, MECHANISMS, RETAIN_SCORES, SELECTIONS  # the allowed values, one place
from golinear.models.training.train_config import TrainConfig


def train(p) -> None:
    d = TrainConfig()
    g = p.add_argument_group("model")
    g.add_argument("--base", default="smollm2-135m", help="backbone: smollm2-135m (embedded), hub id or folder")
    g.add_argument("--mechanism", default="gdn", help=" | ".join(MECHANISMS) + " (default gdn)")
    g.add_argument("--window", type=int, default=56, help="sliding-window tokens (default 56)")
    g.add_argument("--sinks", type=int, default=8, help="sink tokens (default 8)")
    g.add_argument("--short-conv", action=argparse.BooleanOptionalAction, default=True,
                   help="short convolutions on q/k/v (default on)")
    g.add_argument("--conv-on", default=CONV_ON[0], help=" | ".join(CONV_ON) + ": the paths the short conv feeds "
                   f"(default {CONV_ON[0]}; linear: the window + sinks keep the frozen q/k/v; docs/models.md)")
    g.add_argument("--lora", action="store_true", help="LoRA on Wq/Wk/Wv (lr --lora-lr)")
    g.add_argument("--lora-rank", type=int, default=8, help="LoRA rank with --lora (default 8)")
    g.add_argument("--full-layers", default=None, help="comma-separated layers kept as full attention")
    g.add_argument("--keep-full", type=float, default=0.0, help="fraction of layers kept as full attention")
    g.add_argument("--select", default="uniform", help=" | ".join(SELECTIONS) + " (hardness needs --layer-scores)")
    g.add_argument("--layer-scores", default=None, help="JSON from `golinear diagnose` (layer_scores)")
    g.add_argument("--retain", type=int, default=0, help="retention slots per KV head beside sinks + window "
                   "(gdn with a window; docs/retention.md; default 0)")
    g.add_argument("--retain-score", default=RETAIN_SCORES[0],
                   help=" | ".join(RETAIN_SCORES) + f": what earns a slot (default {RETAIN_SCORES[0]})")
    g.add_argument("--scorer", default=None, help="retention scorer file for --retain-score fitted "
                   "(scripts/retention_scorer_probe.py fit writes one; docs/retention.md)")
    g.add_argument("--out-norm", action="store_true", help="per-head output RMSNorm after the op (gla, kgla, gdn), "
                   "its weight calibrated to the attention output's rms on the first batch (docs/models.md)")
    g = p.add_argument_group("data")
    g.add_argument("--data-dir", default=None, help="data folder (default $GOLINEAR_DATA or ../shared/data)")
    g.add_argument("--dataset", default=None, help="a Hugging Face dataset instead of the books corpus")
    g.add_argument("--dataset-config", default=None, help="configuration name of --dataset, if it has several")
    g.add_argument("--dataset-split", default="train", help="split of --dataset to read")
    g.add_argument("--dataset-files", nargs="*", default=None, help="data_files for local builders (json, text)")
    g.add_argument("--text-field", default="text", help="record field holding the text (--dataset, --dataset-files)")
    g.add_argument("--heldout-docs", type=int, default=8, help="books held out (smallest sha256 of the id)")
    g.add_argument("--heldout-fraction", type=float, default=0.01, help="HF datasets: fraction held out by hash")
    g.add_argument("--tokens", default=None, help="prepared token file (.npz): read if present, else written")
    g.add_argument("--prepare-only", action="store_true", help="write --tokens and exit")
    g.add_argument("--prepare-train-tokens", type=int, default=None, help="train tokens to prepare "
                   "(default: what --steps needs)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per packed training sequence")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per process per step")
    g.add_argument("--steps", type=int, default=d.steps,
                   help="optimizer steps (tokens = steps x seq-len x batch size x processes)")
    g.add_argument("--lr", type=float, default=d.lr, help="AdamW peak learning rate of the new parameters")
    g.add_argument("--lora-lr", type=float, default=d.lora_lr, help="peak learning rate of the LoRA parameters")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    g.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear warm-up steps before the cosine decay")
    g.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio, help="the cosine decays to lr x this ratio")
    g.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient-norm clipping threshold")
    g.add_argument("--seed", type=int, default=d.seed, help="seed of the new parameters' initialisation and the data order")
    g.add_argument("--distill", type=float, default=d.distill,
                   help="weight W of the KL to the frozen model's own next-token distribution: loss = (1 - W) x "
                        "cross-entropy + W x KL (0: cross-entropy only; docs/training.md)")
    g.add_argument("--transfer-steps", type=int, default=d.transfer_steps,
                   help="first steps that train each layer's attention output towards the frozen layer's (attention "
                        "transfer, LoLCATs' first stage), before the LM loss (docs/training.md)")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="autocast (default: on GPU)")
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the training step in a CUDA graph, which removes the CPU launch overhead that "
                        "bounds small models (default: on for one CUDA process without FSDP)")
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="run folder (default runs/train/<mechanism...>)")
    g.add_argument("--save-every", type=int, default=d.save_every, help="resume-state interval in steps (>= 1; --save-every-s also saves by time)")
    g.add_argument("--log-every", type=int, default=d.log_every, help="log loss, lr, gradient norm and tokens/s every N steps")
    g.add_argument("--eval-sequences", type=int, default=d.eval_sequences,
                   help="held-out sequences of --seq-len tokens for the final losses")
    g.add_argument("--time-budget-s", type=float, default=None,
                   help="fit the step count into this many seconds (measured after a few steps)")
    g.add_argument("--stop-after", type=int, default=None, help="leave after this global step (resume later)")
    g.add_argument("--stop-at-s", type=float, default=None, help="leave after this many seconds of this run, "
                   "saving a resumable state (the schedule is not shortened, unlike --time-budget-s)")
    g.add_argument("--save-every-s", type=float, default=d.save_every_s,
                   help=f"also save the resume state at least this often, in seconds (default {d.save_every_s:g})")
    g.add_argument("--keep-state", action="store_true", help="keep the resume state (state.safetensors) after a finished run")
    g.add_argument("--force", action="store_true", help="train again although --out holds a finished run "
                   "(its checkpoint and log are replaced)")
    g.add_argument("--fsdp", action="store_true", help="shard backbone and new parameters over the processes "
                   "(FSDP2, one unit per decoder layer); also on with an accelerate FSDP config")
    g.add_argument("--note", default=None, help="free text stored in the config (e.g. why fewer tokens)")


def diagnose(p) -> None:
    p.add_argument("--base", default="smollm2-135m", help="backbone (default: the embedded SmolLM2-135M)")
    p.add_argument("--checkpoint", action="append", default=[], help="linearized checkpoint folder (repeatable)")
    p.add_argument("--fresh", action="append", default=[], help="also diagnose an untrained linearization: "
                   "mechanism[:window[:sinks]] (repeatable), e.g. gdn or gdn:56:8")
    p.add_argument("--data-dir", default=None, help="data folder (default $GOLINEAR_DATA or ../shared/data)")
    p.add_argument("--tokens", default=None, help="prepared token file (.npz) whose held-out stream to use")
    p.add_argument("--heldout-docs", type=int, default=8, help="books held out (must match training)")
    p.add_argument("--sequences", type=int, default=8, help="held-out sequences (default 8)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (default 1024)")
    p.add_argument("--seed", type=int, default=None, help="init seed for 'before' (default: the run's seed)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--out", default="runs/diagnose", help="output folder (JSON + PNGs + layer_scores.json)")
