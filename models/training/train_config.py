"""`TrainConfig`: the training settings, apart from golinear.models.training.train so that `golinear train --help` (which shows
their defaults, models.training.cli_args) needs no torch."""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class TrainConfig:
    seq_len: int = 4096
    batch_size: int = 1               # sequences per rank per step
    steps: int = 2500
    lr: float = 2e-3
    lora_lr: float = 5e-4
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0         # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 250             # resume-state interval (steps)
    save_every_s: float = 300.0       # ... and at least this often in seconds (a kill loses <= 5 minutes)
    log_every: int = 10
    eval_sequences: int = 16          # held-out sequences of seq_len for the final losses
    time_budget_s: float | None = None  # fit the step count to this budget after measuring speed
    stop_after: int | None = None     # leave this invocation after this global step (resume later)
    stop_at_s: float | None = None    # leave this invocation after this many seconds (resume later; unlike
                                      # time_budget_s the schedule keeps the requested number of steps)
    bf16: bool | None = None          # autocast; None = on for CUDA
    cuda_graph: bool | None = None    # capture the step in a CUDA graph; None = on for one CUDA process
                                      # without FSDP (4.8x the eager speed on the H200), off otherwise
    distill: float = 0.0              # weight of the KL to the frozen model's predictions (models.training.distill)
    transfer_steps: int = 0           # first steps that match each layer's attention output to the frozen layer's

    def validate(self):
        """Every value checked before any data is prepared or anything is written (one line naming its option)."""
        def bad(name, allowed):
            return ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: allowed: {allowed}")
        for name in ("seq_len", "batch_size", "steps", "log_every", "eval_sequences", "save_every"):
            if getattr(self, name) < 1:
                raise bad(name, ">= 1")
        for name in ("lr", "lora_lr"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise bad(name, "a finite number > 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise bad("weight_decay", "a finite number >= 0")
        if not 0 <= self.transfer_steps < self.steps:
            raise bad("transfer_steps", f"0..{self.steps - 1} (fewer than --steps: the rest trains on the LM loss)")
        if not 0 <= self.distill <= 1:
            raise bad("distill", "0..1 (0: cross-entropy only, 1: the KL to the frozen model only)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise bad("min_lr_ratio", "0..1 (the cosine's floor as a share of --lr)")
        if not self.grad_clip > 0:
            raise bad("grad_clip", "> 0 (the largest gradient norm; inf: no clipping)")
        if not 0 <= self.warmup_steps < self.steps:
            raise bad("warmup_steps", f"0..{self.steps - 1} (fewer than --steps)")
        if not (math.isfinite(self.save_every_s) and self.save_every_s > 0):
            raise bad("save_every_s", "a finite number > 0")
        if self.time_budget_s is not None and not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
            raise bad("time_budget_s", "a finite number of seconds > 0")
        if self.stop_at_s is not None and not (math.isfinite(self.stop_at_s) and self.stop_at_s >= 0):
            raise bad("stop_at_s", "a finite number of seconds >= 0")
