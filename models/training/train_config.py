"""`TrainConfig`: the training settings, apart from golinear.models.training.train so that `golinear train --help` (which shows
their defaults, models.cli_args) needs no torch."""
from __future__ import annotations

import dataclasses


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
    save_every: int = 250             # resume-state interval (steps); 0 = only at the end / on stop
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

    def validate(self):
        for name in ("seq_len", "batch_size", "steps", "log_every", "eval_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; allowed: >= 1")
        if self.lr <= 0 or self.lora_lr <= 0:
            raise ValueError(f"learning rates must be > 0 (lr={self.lr}, lora_lr={self.lora_lr})")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps}; allowed: 0..steps-1 ({self.steps - 1})")
        if self.save_every < 0:
            raise ValueError(f"save_every={self.save_every}; allowed: >= 0")
        if not self.save_every_s > 0:
            raise ValueError(f"save_every_s={self.save_every_s}; allowed: > 0")
