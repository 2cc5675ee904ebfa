"""`golinear train`'s trainer: train only the new parameters of a linearized model (frozen backbone, next-token CE).

Paper defaults: packed 4096-token sequences, batch 1, 2,500 steps (~10M tokens), AdamW lr 2e-3 (5e-4 for
LoRA parameters), cosine schedule, gradient clipping at 1, bf16 autocast on GPU. The run folder gets the
new parameters (models.checkpoint.weights), `train_log.jsonl`, `train_config.json` (every setting, seeds, data
provenance, timings, held-out losses next to the full-attention model's) and `loss.png`.
`state.safetensors` in the same folder is the resume point (optimizer, schedule, RNG, data position = step), saved
as data (models.training.resume_state): re-running the same command continues exactly where an interrupted run stopped.
Data parallel under `accelerate launch` (each rank reads its own slice of every global batch). FSDP
(`--fsdp`, or an accelerate config with `distributed_type: FSDP`, `fsdp_version: 2`) shards the frozen
backbone and the new parameters across the ranks with torch's FSDP2 `fully_shard`, one unit per decoder
layer plus the root; checkpoints and the resume state hold full (gathered) tensors, so they are the same files a
one-process run writes.
The command line is models.training.train_cli, the FSDP set-up models.training.train_fsdp, the run-folder helpers
models.training.train_utils.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import time
import warnings
from pathlib import Path

import torch

from golinear.models.training import data as data_mod
from golinear.models.training import graph_step, resume_state
from golinear.models.util.atomic import atomic_path, atomic_write
from golinear.models.training.train_config import TrainConfig  # apart, so that `golinear train --help` needs no torch
from golinear.models.training.sharding import shard_like
from golinear.models.training.train_fsdp import full_attention, full_tensor
from golinear.models.training.resume_state import STATE_FILE
from golinear.models.training.distill import step_loss
from golinear.models.training.train_utils import heldout_loss, read_log, rng_state, set_rng_state

LOG_FILE = "train_log.jsonl"
CONFIG_FILE = "train_config.json"
PLOT_FILE = "loss.png"


# ---------------------------------------------------------------------------------------------- optimisation
def cosine_lr_factor(step: int, total: int, warmup: int = 0, min_ratio: float = 0.0) -> float:
    """Multiplier of the base lr for update number `step` (0-based): linear warmup, then cosine."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(named_params: dict, cfg: TrainConfig) -> list[dict]:
    """AdamW groups: LoRA parameters at lora_lr, every other new parameter at lr."""
    lora = [p for n, p in named_params.items() if "lora_" in n]
    rest = [p for n, p in named_params.items() if "lora_" not in n]
    groups = [{"params": rest, "lr": cfg.lr, "base_lr": cfg.lr, "name": "new"}]
    if lora:
        groups.append({"params": lora, "lr": cfg.lora_lr, "base_lr": cfg.lora_lr, "name": "lora"})
    return [g for g in groups if g["params"]]


def trainable_parameters(model) -> dict:
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not named:
        raise ValueError("the model has no trainable parameters (was it linearized?)")
    return named


def check_linear_state_is_reached(model, seq_len: int, processes: int) -> None:
    """Under DDP every trainable parameter must take part in every step: a sequence that fits in a layer's
    sinks + window (+ retention slots) never reaches its linear state, whose parameters then get no gradient and
    DDP stops at the next step ("Expected to have finished reduction"). One process trains on without them."""
    from golinear.models.attention.layers import LinearizedAttention
    if processes == 1:
        return
    spans = [m.sinks + m.window + m.retain for m in model.modules()
             if isinstance(m, LinearizedAttention) and m.lin is not None]
    if spans and seq_len <= max(spans):
        raise ValueError(f"seq_len={seq_len} with {processes} data-parallel processes: every token stays in the "
                         f"softmax path (sinks + window + retained slots = {max(spans)}), so the linear state's "
                         f"parameters get no gradient and DDP stops; allowed: seq_len > {max(spans)}")


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """The loop: owns optimizer, schedule position, RNG and the data position (the global step)."""

    def __init__(self, model, sequences: data_mod.PackedSequences, cfg: TrainConfig, out: Path,
                 accelerator=None, meta: dict | None = None, deadline: float | None = None, clock=time.perf_counter):
        """`model` either whole (moved to the device; DDP when distributed) or sharded by `shard_model`; `clock`
        (seconds) times the run, its budget and its saves (a test gives its own)."""
        from accelerate import Accelerator
        from torch.distributed.fsdp import FSDPModule

        cfg.validate()
        self.cfg, self.out, self.meta = cfg, Path(out), dict(meta or {})
        self.out.mkdir(parents=True, exist_ok=True)
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.device = self.acc.device
        self.bf16 = cfg.bf16 if cfg.bf16 is not None else self.device.type == "cuda"
        self.sequences = sequences
        self.raw_model = model
        self.fsdp = isinstance(model, FSDPModule)  # the optimizer then holds this rank's shards
        self.named = trainable_parameters(model)
        if not self.fsdp:
            check_linear_state_is_reached(model, cfg.seq_len, self.acc.num_processes)
        self.optimizer = torch.optim.AdamW(param_groups(self.named, cfg), lr=cfg.lr, betas=tuple(cfg.betas),
                                           weight_decay=cfg.weight_decay)
        self.model = model if self.fsdp else self.acc.prepare(model)  # DDP wrapper when distributed
        why = ("the device is not CUDA" if self.device.type != "cuda" else "FSDP shards the model"
               if self.fsdp else f"{self.acc.num_processes} processes" if self.acc.num_processes > 1 else None)
        self.graphed = cfg.cuda_graph if cfg.cuda_graph is not None else why is None
        self._graph, self.graph_error = None, None
        if self.graphed:
            if why:
                raise ValueError(f"--cuda-graph needs one CUDA process without FSDP; here {why}")
            graph_step.make_capturable(self.optimizer, self.device)
        self.step = 0
        self.loss_window: list[float] = []  # losses since the last log line (part of the state)
        self.total_steps = cfg.steps
        self.budget_note = None
        self.clock = clock
        self.deadline = deadline          # clock time by which training must end (time budget)
        self.hard_stop_slack_s = 5.0
        self.stopped_at_deadline = False
        self.stop_requested = False  # set by SIGTERM or SIGINT once catch_sigterm() is called
        self.stop_signal = None
        self.elapsed_before = 0.0  # training seconds spent by earlier invocations (resume)
        self.world = self.acc.num_processes
        self.rank = self.acc.process_index

    # -- state
    def state_dict(self) -> dict:
        """Under FSDP a collective (every rank gathers the full tensors); the result is the same layout a
        non-sharded run writes, so a state is tied to the number of processes only through the data order."""
        optimizer = self.optimizer.state_dict()
        if self.fsdp:
            optimizer["state"] = {i: {k: full_tensor(v).detach().cpu() if torch.is_tensor(v) else v
                                      for k, v in s.items()} for i, s in optimizer["state"].items()}
        return {"step": self.step, "total_steps": self.total_steps, "budget_note": self.budget_note,
                "loss_window": [float(x) for x in self.loss_window],
                "params": {n: full_tensor(p.detach()).cpu().clone() for n, p in self.named.items()},
                "optimizer": optimizer, "rng": rng_state(),
                "elapsed_s": self.elapsed_before + self._run_elapsed(), "config": dataclasses.asdict(self.cfg),
                "meta": self.meta, "world_size": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state["world_size"] != self.world:
            raise ValueError(f"resume state was written with {state['world_size']} processes, this run has "
                             f"{self.world}; resume with the same number")
        with torch.no_grad():
            for n, p in self.named.items():
                p.copy_(shard_like(state["params"][n], p))
        optimizer = state["optimizer"]
        if self.fsdp:  # full optimizer tensors -> this rank's shards (param order = state index)
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            optimizer = dict(optimizer, state={
                i: {k: shard_like(v, params[int(i)]) if torch.is_tensor(v) and v.shape == params[int(i)].shape
                    else v for k, v in s.items()} for i, s in optimizer["state"].items()})
        self.optimizer.load_state_dict(optimizer)
        if self.graphed:  # either kind of run resumes the other's state
            graph_step.make_capturable(self.optimizer, self.device)
        else:
            graph_step.make_eager(self.optimizer)
        self.step, self.total_steps = state["step"], state["total_steps"]
        self.budget_note = state.get("budget_note")
        self.loss_window = list(state.get("loss_window", []))
        self.elapsed_before = state["elapsed_s"]
        self.meta.update(state.get("meta", {}))
        set_rng_state(state["rng"])

    def save_state(self) -> None:
        state = self.state_dict() if self.fsdp or self.acc.is_main_process else None
        if self.acc.is_main_process:
            with atomic_path(self.out / STATE_FILE) as tmp:
                resume_state.save(state, tmp)
        self.acc.wait_for_everyone()

    def try_resume(self) -> bool:
        """Continue from the resume state if there is one. Either way the log keeps only the steps up to where
        training continues (the saved step, or none when starting over), so no step is ever logged twice."""
        path = self.out / STATE_FILE
        resumed = path.exists()
        if resumed:
            state = resume_state.load(path)
            if set(self.named) - set(state["params"]):  # another model's state: one line, not a KeyError
                raise ValueError(f"resume state {str(path)!r} lacks parameters of this model; delete it to start over")
            self.load_state_dict(state)
        log = self.out / LOG_FILE
        if self.acc.is_main_process and log.exists():
            records = read_log(log)
            kept = [r for r in records if r["step"] <= self.step]
            if kept != records:
                atomic_write(log, "".join(json.dumps(r) + "\n" for r in kept))
        return resumed

    # -- loop
    def _run_elapsed(self) -> float:
        return self.clock() - self._t0 if hasattr(self, "_t0") else 0.0

    def _set_lr(self) -> float:
        factor = cosine_lr_factor(self.step, self.total_steps, self.cfg.warmup_steps, self.cfg.min_lr_ratio)
        for g in self.optimizer.param_groups:
            graph_step.set_lr(g, g["base_lr"] * factor)
        return self.optimizer.param_groups[0]["base_lr"] * factor

    def _batch(self) -> torch.Tensor:
        b = self.cfg.batch_size
        start = self.step * b * self.world + self.rank * b
        return self.sequences.batch(start, b).to(self.device)

    def _fit_budget(self, rate: float, allow_growth: bool) -> None:
        """Set total_steps so the run ends by the deadline at the measured rate (steps/s).

        Re-fitted every `refit_every` steps; growth (up to the requested steps) only in the first 60% of
        the budget, so a late speed-up never re-raises a decayed learning rate much."""
        remaining = self.deadline - self.clock()
        fit = self.step + max(1, int(remaining * rate * 0.97))
        new_total = min(self.cfg.steps, fit)
        if not allow_growth:
            new_total = min(new_total, self.total_steps)
        new_total = [max(new_total, self.step + 1)]
        if self.world > 1:
            from accelerate.utils import broadcast_object_list
            broadcast_object_list(new_total, from_process=0)
        self.total_steps = new_total[0]
        if self.total_steps < self.cfg.steps:
            self.budget_note = (f"time budget {self.cfg.time_budget_s:.0f}s: {self.cfg.steps} steps requested, "
                                f"{self.total_steps} fit (last fit at step {self.step}, {rate:.2f} steps/s)")
        else:
            self.budget_note = None

    def _global_mean(self, value: torch.Tensor) -> float:
        """The loss of the whole global batch (the mean over ranks), as a one-process run logs it."""
        if self.world > 1:
            value = self.acc.reduce(value, reduction="mean")
        return float(value)

    def _agreed(self, flag: bool) -> bool:
        """Rank 0's answer on every rank: every rank must stop at the same step."""
        flag = [flag]
        if self.world > 1:
            from accelerate.utils import broadcast_object_list
            broadcast_object_list(flag, from_process=0)
        return flag[0]

    def catch_sigterm(self) -> None:
        """From now on SIGTERM and SIGINT (Ctrl-C) stop the loop after the step in flight, with a resumable state
        (as --stop-at-s does), instead of killing the process: a caller with a wall-clock deadline
        (a cluster scheduler) loses no steps, and a run already past its last step still writes its
        checkpoint. `stop_signal` keeps which signal it was (the command then exits 128 + it). Main thread only."""
        def stop(signum, _frame):
            self.stop_requested, self.stop_signal = True, signum
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)

    def _past_deadline(self, now: float) -> bool:
        return self._agreed(now > self.deadline + self.hard_stop_slack_s)

    def train(self) -> dict:
        from tqdm.auto import tqdm

        cfg = self.cfg
        tokens_per_step = cfg.batch_size * cfg.seq_len * self.world
        self._t0 = self.clock()
        if cfg.time_budget_s and self.deadline is None:
            self.deadline = self._t0 + cfg.time_budget_s - self.elapsed_before
        budget_start = self._t0
        start_step, window = self.step, self.loss_window
        fit_from = fit_t = None
        fits = 0  # first fit after 10 measured steps, then every 50
        self.stopped_at_deadline = False
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not self.acc.is_main_process,
                   desc=self.out.name, unit="step", dynamic_ncols=True)
        log_f = open(self.out / LOG_FILE, "a") if self.acc.is_main_process else None
        stop_after = cfg.stop_after if cfg.stop_after is not None else math.inf
        steady_t0 = steady_step0 = None
        last_save = self.clock()
        try:
            while self.step < self.total_steps and self.step < stop_after:
                lr = self._set_lr()
                ids = self._batch()
                loss_fn = step_loss(cfg, self.step)
                if self._graph is not None and self._graph.loss_fn.keywords != loss_fn.keywords:  # transfer ended
                    self._graph = None
                if self.graphed and self._graph is None:
                    try:
                        self._graph = graph_step.GraphedTrainStep(self.model, self.optimizer, list(self.named.values()),
                                                                  cfg.grad_clip, self.bf16, ids, loss_fn=loss_fn)
                    except RuntimeError as e:  # e.g. a host sync inside the step: run eagerly, say so
                        warnings.warn(f"--cuda-graph: capturing the step failed ({str(e)[:300]}); training eagerly")
                        self.graphed, self.graph_error = False, str(e)[:1000]
                if self.graphed:
                    loss, grad_norm = self._graph(ids)
                    loss = loss.clone()  # the next replay overwrites it
                else:
                    with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                        loss = loss_fn(self.model, ids)
                    graph_step.require_trainable(loss)
                    self.acc.backward(loss)
                    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(list(self.named.values()), cfg.grad_clip))
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = loss.detach()
                self.step += 1
                # one process: the device tensor, read once per log line (a read is a host sync); several: the
                # global batch's loss (a collective every step, as every rank must take part)
                window.append(loss if self.world == 1 else self._global_mean(loss))
                done_here = self.step - start_step
                if done_here == 3:  # steady-state timing starts after compilation / autotuning
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    steady_t0, steady_step0 = self.clock(), self.step
                if self.deadline is not None:
                    now = self.clock()
                    if done_here == 3:
                        fit_from, fit_t = self.step, now
                    elif fit_from is not None and self.step - fit_from == (10 if fits == 0 else 50):
                        if self.device.type == "cuda":
                            torch.cuda.synchronize()
                        now = self.clock()
                        early = (now - budget_start) < 0.6 * (self.deadline - budget_start)
                        self._fit_budget((self.step - fit_from) / (now - fit_t), allow_growth=early)
                        fit_from, fit_t, fits = self.step, now, fits + 1
                        bar.total = self.total_steps
                        bar.refresh()
                    if self.step % 10 == 0 and self._past_deadline(now) and self.step < self.total_steps:
                        self.stopped_at_deadline = True  # slower than fitted: end here, schedule unfinished
                        self.budget_note = (self.budget_note or "") + f"; hard stop at the deadline, step {self.step}"
                        self.total_steps = self.step
                elapsed = self.elapsed_before + self._run_elapsed()
                tok_s = done_here * tokens_per_step / max(self._run_elapsed(), 1e-9)
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    mean_loss = sum(float(x) for x in window) / len(window)
                    bar.set_postfix(loss=f"{mean_loss:.3f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
                    rec = {"step": self.step, "tokens": self.step * tokens_per_step,
                           "loss": mean_loss, "lr": lr, "grad_norm": float(grad_norm),
                           "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tok_s, 1)}
                    window.clear()
                    if log_f:
                        log_f.write(json.dumps(rec) + "\n")
                        log_f.flush()
                due = cfg.save_every and self.step % cfg.save_every == 0
                if not due and self.step % 10 == 0:  # by time too: long steps must not risk hours of work
                    due = self._agreed(self.clock() - last_save > cfg.save_every_s)
                if due and self.step < self.total_steps:
                    self.save_state()
                    last_save = self.clock()
                if cfg.stop_at_s is not None and self._agreed(self._run_elapsed() > cfg.stop_at_s):
                    break  # the state is saved below: re-running the command resumes
                if (self.world == 1 or self.step % 10 == 0) and self._agreed(self.stop_requested):
                    break  # SIGTERM (catch_sigterm): likewise
        finally:
            bar.close()
            if log_f:
                log_f.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        run_s = self._run_elapsed()
        steady = None
        if steady_t0 is not None and self.step > steady_step0:
            steady = (self.step - steady_step0) * tokens_per_step / (self.clock() - steady_t0)
        finished = self.step >= self.total_steps
        if not finished or cfg.save_every:
            self.save_state()
        return {"finished": finished, "step": self.step, "total_steps": self.total_steps,
                "requested_steps": cfg.steps, "budget_note": self.budget_note,
                "tokens": self.step * tokens_per_step, "tokens_this_invocation": (self.step - start_step) * tokens_per_step,
                "wall_s_this_invocation": round(run_s, 2), "train_wall_s": round(self.elapsed_before + run_s, 2),
                "tokens_per_s": round((self.step - start_step) * tokens_per_step / max(run_s, 1e-9), 1),
                "steady_tokens_per_s": None if steady is None else round(steady, 1),
                "stopped_at_deadline": self.stopped_at_deadline,
                "cuda_graph": self.graphed, "cuda_graph_error": self.graph_error,
                "world_size": self.world, **self.parameter_counts()}

    def parameter_counts(self) -> dict:
        """Model parameters in all and held by this rank (rank 0's counts go to the log): shows the sharding."""
        from torch.distributed.tensor import DTensor
        params = list(self.raw_model.parameters())
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        return {"parameters": sum(p.numel() for p in params), "parameters_on_rank": local}

    def evaluate(self, sequences: torch.Tensor, attention_modules: list | None = None) -> float:
        """Held-out loss; with `attention_modules`, of the full-attention model (the original attention).

        Under FSDP every rank must call it (each forward gathers the layers) and every rank gets the loss."""
        model = self.model if self.fsdp else self.raw_model
        ctx = full_attention(model, attention_modules) if attention_modules else contextlib.nullcontext()
        with ctx:
            return heldout_loss(model, sequences, self.device, self.bf16)

    def full_new_parameters(self) -> dict:
        """name -> full fp32 CPU tensor of every new parameter (a collective under FSDP)."""
        from golinear.models.attention.linearize import new_parameters
        return {n: full_tensor(p.detach()).float().cpu().contiguous() for n, p in new_parameters(self.raw_model).items()}

