"""`golinear train`: train only the new parameters of a linearized model (frozen backbone, next-token CE).

Paper defaults: packed 4096-token sequences, batch 1, 2,500 steps (~10M tokens), AdamW lr 2e-3 (5e-4 for
LoRA parameters), cosine schedule, gradient clipping at 1, bf16 autocast on GPU. The run folder gets the
new parameters (models.checkpoint), `train_log.jsonl`, `train_config.json` (every setting, seeds, data
provenance, timings, held-out losses next to the full-attention model's) and `loss.png`.
`state.pt` in the same folder is the resume point (optimizer, schedule, RNG, data position = step):
re-running the same command continues exactly where an interrupted run stopped.
Data parallel under `accelerate launch` (each rank reads its own slice of every global batch). FSDP
(`--fsdp`, or an accelerate config with `distributed_type: FSDP`, `fsdp_version: 2`) shards the frozen
backbone and the new parameters across the ranks with torch's FSDP2 `fully_shard`, one unit per decoder
layer plus the root; checkpoints and `state.pt` hold full (gathered) tensors, so they are the same files a
one-process run writes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from models import data as data_mod
from models import graph_step
from models.atomic import atomic_path, atomic_write

STATE_FILE = "state.pt"
LOG_FILE = "train_log.jsonl"
CONFIG_FILE = "train_config.json"
PLOT_FILE = "loss.png"


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


# ---------------------------------------------------------------------------------------------- helpers
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


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def atomic_write_bytes(path: Path, writer) -> None:
    """`writer(tmp)` fills a temp file that then replaces `path` (models.atomic: umask mode, no half files)."""
    with atomic_path(path) as tmp:
        writer(str(tmp))


def atomic_write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


@torch.no_grad()
def heldout_loss(model, sequences: torch.Tensor, device, bf16: bool) -> float:
    """Token-weighted mean next-token cross-entropy over the held-out sequences."""
    total, count = 0.0, 0
    for seq in sequences:
        ids = seq.unsqueeze(0).to(device)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        n = ids.shape[1] - 1
        total += float(loss) * n
        count += n
    return total / count


def read_json(path: Path) -> dict:
    """A JSON object from the run folder, or a one-line error naming the file."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not valid JSON ({e}); delete it or use --force") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a JSON object; delete it or use --force")
    return data


def read_log(path: Path) -> list[dict]:
    """The training log; a last line cut short by a kill is dropped (every other line must parse)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"training log {str(path)!r}: line {i + 1} is not JSON") from None
    return out


def plot_loss(log: list[dict], png: Path, title: str = "", heldout: dict | None = None) -> None:
    """Training loss against tokens seen, with the held-out losses as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if log:
        tokens = [r["tokens"] / 1e6 for r in log]
        ax.plot(tokens, [r["loss"] for r in log], lw=1.0, label="train loss")
    for (name, value), color in zip((heldout or {}).items(), ("k", "tab:red", "tab:green")):
        if value is not None:
            ax.axhline(value, ls="--", lw=1.0, color=color, label=f"{name}: {value:.3f}")
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_bytes(png, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- FSDP
def _env_bool(env, name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{name}={value!r}: expected true or false (FSDP2 settings)")


def fsdp_settings(flag: bool, num_processes: int, env=None) -> dict | None:
    """FSDP settings when FSDP is asked for (`--fsdp` or accelerate's FSDP config), else None.

    `accelerate launch` exports an FSDP config as ACCELERATE_USE_FSDP / FSDP_* variables (on CPU too,
    where accelerate itself would fall back to plain data parallel); golinear applies FSDP2 itself and
    reads fsdp_version, fsdp_offload_params, fsdp_reshard_after_forward, fsdp_activation_checkpointing.
    Loading is always rank-0-only (what fsdp_cpu_ram_efficient_loading asks for); wrapping is per layer."""
    env = os.environ if env is None else env
    if not (flag or _env_bool(env, "ACCELERATE_USE_FSDP", False)):
        return None
    if num_processes < 2:
        raise ValueError(f"FSDP shards across processes but this run has {num_processes}; launch it with "
                         "`accelerate launch --num_processes N` (N >= 2), or drop --fsdp")
    version = env.get("FSDP_VERSION", "2")
    if version != "2":
        raise ValueError(f"fsdp_version {version}: golinear train shards with FSDP2 (fully_shard; mixed frozen and "
                         "trainable parameters in one unit); set `fsdp_version: 2` in the accelerate config")
    if _env_bool(env, "FSDP_OFFLOAD_PARAMS", False):
        raise ValueError("fsdp_offload_params: true is not supported by golinear train; set it to false")
    return {"version": 2, "reshard_after_forward": _env_bool(env, "FSDP_RESHARD_AFTER_FORWARD", True),
            "activation_checkpointing": _env_bool(env, "FSDP_ACTIVATION_CHECKPOINTING", False),
            "unit": "decoder layer"}


def shard_model(model, device: torch.device, num_processes: int, reshard_after_forward: bool = True,
                activation_checkpointing: bool = False, **_):
    """FSDP2 in place: one unit per decoder layer, the root holds embeddings, final norm and LM head.

    FSDP2 shards every parameter on its first dimension, frozen or not, so a unit mixes frozen backbone
    weights and trainable new ones freely; gradients exist (and are reduce-scattered) only for the latter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from models.linearize import _decoder_layers

    layers = _decoder_layers(model)
    scalars = [n for n, p in model.named_parameters() if p.dim() == 0]
    if scalars:
        raise ValueError(f"FSDP shards parameters on their first dimension; 0-dim parameters cannot be sharded: "
                         f"{scalars[:5]}")
    if activation_checkpointing:  # recompute each layer in backward (FSDP re-gathers its weights)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # transformers checkpoints only in training mode (Llama-family layers have no dropout)
    mesh = init_device_mesh(device.type, (num_processes,))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def backbone_skeleton(name_or_path: str):
    """The backbone's modules on the meta device (no memory, no weights): what ranks > 0 start from."""
    import transformers
    from models.backbone import check_architecture, resolve
    config = transformers.AutoConfig.from_pretrained(resolve(name_or_path))
    check_architecture(config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def load_sharded(base: str, lin_cfg, seed: int, acc, fsdp: dict):
    """(sharded linearized model, original attention modules). Only rank 0 reads the backbone (host memory:
    one fp32 copy, not one per process); the other ranks build it on the meta device; after sharding, rank
    0 broadcasts every tensor and each rank keeps its shard. New-parameter init = a one-process run's."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from models.backbone import load_backbone
    from models.linearize import _decoder_layers, linearize

    if acc.is_main_process:
        model, _ = load_backbone(base, dtype="float32", device="cpu")
    else:
        model = backbone_skeleton(base)
    attention_modules = [layer.self_attn for layer in _decoder_layers(model)]
    seed_everything(seed)  # new-parameter initialisation is a function of the seed (rank 0's is kept)
    linearize(model, lin_cfg, base_name=base)
    full = model.state_dict() if acc.is_main_process else {}
    shard_model(model, acc.device, acc.num_processes, **fsdp)
    if not acc.is_main_process:
        model.to_empty(device=acc.device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    seen = set()
    for _, buf in model.named_buffers():  # non-persistent buffers (rotary inv_freq) are not in the state dict
        if id(buf) not in seen:
            seen.add(id(buf))
            dist.broadcast(buf, src=0)
    return model, attention_modules


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP shard (a collective: every rank must call it), else `t` itself."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full`, laid out as `param` (no communication: every rank holds `full`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    if not isinstance(param, DTensor):
        return full.to(param.device)
    return distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)


@contextlib.contextmanager
def full_attention(model, attention_modules: list):
    """Run `model` with its original softmax attention modules (they share the frozen q/k/v/o projections,
    so under FSDP the layer's unit gathers them as usual): the full-attention reference of a sharded model."""
    from models.linearize import _decoder_layers
    layers = _decoder_layers(model)
    current = [layer.self_attn for layer in layers]
    for layer, attn in zip(layers, attention_modules):
        layer.self_attn = attn
    try:
        yield model
    finally:
        for layer, attn in zip(layers, current):
            layer.self_attn = attn


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """The loop: owns optimizer, schedule position, RNG and the data position (the global step)."""

    def __init__(self, model, sequences: data_mod.PackedSequences, cfg: TrainConfig, out: Path,
                 accelerator=None, meta: dict | None = None, deadline: float | None = None):
        """`model` either whole (moved to the device; DDP when distributed) or sharded by `shard_model`."""
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
        self.deadline = deadline          # perf_counter time by which training must end (time budget)
        self.hard_stop_slack_s = 5.0
        self.stopped_at_deadline = False
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
            atomic_write_bytes(self.out / STATE_FILE, lambda tmp: torch.save(state, tmp))
        self.acc.wait_for_everyone()

    def try_resume(self) -> bool:
        """Continue from `state.pt` if there is one. Either way the log keeps only the steps up to where
        training continues (the saved step, or none when starting over), so no step is ever logged twice."""
        path = self.out / STATE_FILE
        resumed = path.exists()
        if resumed:
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as e:  # a damaged state file: name it rather than a pickle traceback
                raise ValueError(f"resume state {str(path)!r} is unreadable ({type(e).__name__}); delete it to "
                                 "start over") from None
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
        return time.perf_counter() - self._t0 if hasattr(self, "_t0") else 0.0

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
        remaining = self.deadline - time.perf_counter()
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

    def _past_deadline(self, now: float) -> bool:
        return self._agreed(now > self.deadline + self.hard_stop_slack_s)

    def train(self) -> dict:
        from tqdm.auto import tqdm

        cfg = self.cfg
        tokens_per_step = cfg.batch_size * cfg.seq_len * self.world
        self._t0 = time.perf_counter()
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
        last_save = time.perf_counter()
        try:
            while self.step < self.total_steps and self.step < stop_after:
                lr = self._set_lr()
                ids = self._batch()
                if self.graphed and self._graph is None:
                    try:
                        self._graph = graph_step.GraphedTrainStep(self.model, self.optimizer, list(self.named.values()),
                                                                  cfg.grad_clip, self.bf16, ids)
                    except RuntimeError as e:  # e.g. a host sync inside the step: run eagerly, say so
                        warnings.warn(f"--cuda-graph: capturing the step failed ({str(e)[:300]}); training eagerly")
                        self.graphed, self.graph_error = False, str(e)[:1000]
                if self.graphed:
                    loss, grad_norm = self._graph(ids)
                    loss = loss.clone()  # the next replay overwrites it
                else:
                    with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                        loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
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
                    steady_t0, steady_step0 = time.perf_counter(), self.step
                if self.deadline is not None:
                    now = time.perf_counter()
                    if done_here == 3:
                        fit_from, fit_t = self.step, now
                    elif fit_from is not None and self.step - fit_from == (10 if fits == 0 else 50):
                        if self.device.type == "cuda":
                            torch.cuda.synchronize()
                        now = time.perf_counter()
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
                    due = self._agreed(time.perf_counter() - last_save > cfg.save_every_s)
                if due and self.step < self.total_steps:
                    self.save_state()
                    last_save = time.perf_counter()
                if cfg.stop_at_s is not None and self._agreed(self._run_elapsed() > cfg.stop_at_s):
                    break  # the state is saved below: re-running the command resumes
        finally:
            bar.close()
            if log_f:
                log_f.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        run_s = self._run_elapsed()
        steady = None
        if steady_t0 is not None and self.step > steady_step0:
            steady = (self.step - steady_step0) * tokens_per_step / (time.perf_counter() - steady_t0)
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
        from models.linearize import new_parameters
        return {n: full_tensor(p.detach()).float().cpu().contiguous() for n, p in new_parameters(self.raw_model).items()}


# ---------------------------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    import argparse
    d = TrainConfig()
    g = p.add_argument_group("model")
    g.add_argument("--base", default="smollm2-135m", help="backbone: smollm2-135m (embedded), hub id or folder")
    g.add_argument("--mechanism", default="gdn", help="gla | kgla | gdn | hedgehog | none (default gdn)")
    g.add_argument("--window", type=int, default=56, help="sliding-window tokens (default 56)")
    g.add_argument("--sinks", type=int, default=8, help="sink tokens (default 8)")
    g.add_argument("--short-conv", action=argparse.BooleanOptionalAction, default=True,
                   help="short convolutions on q/k/v (default on)")
    g.add_argument("--lora", action="store_true", help="LoRA on Wq/Wk/Wv (lr --lora-lr)")
    g.add_argument("--full-layers", default=None, help="comma-separated layers kept as full attention")
    g.add_argument("--keep-full", type=float, default=0.0, help="fraction of layers kept as full attention")
    g.add_argument("--select", default="uniform", help="uniform | hardness (needs --layer-scores)")
    g.add_argument("--layer-scores", default=None, help="JSON from `golinear diagnose` (layer_scores)")
    g = p.add_argument_group("data")
    g.add_argument("--data-dir", default=None, help="data folder (default $GOLINEAR_DATA or ../shared/data)")
    g.add_argument("--dataset", default=None, help="a Hugging Face dataset instead of the books corpus")
    g.add_argument("--dataset-config", default=None)
    g.add_argument("--dataset-split", default="train")
    g.add_argument("--dataset-files", nargs="*", default=None, help="data_files for local builders (json, text)")
    g.add_argument("--text-field", default="text")
    g.add_argument("--heldout-docs", type=int, default=8, help="books held out (smallest sha256 of the id)")
    g.add_argument("--heldout-fraction", type=float, default=0.01, help="HF datasets: fraction held out by hash")
    g.add_argument("--tokens", default=None, help="prepared token file (.npz): read if present, else written")
    g.add_argument("--prepare-only", action="store_true", help="write --tokens and exit")
    g.add_argument("--prepare-train-tokens", type=int, default=None, help="train tokens to prepare "
                   "(default: what --steps needs)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per process per step")
    g.add_argument("--steps", type=int, default=d.steps)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--lora-lr", type=float, default=d.lora_lr)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    g.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio)
    g.add_argument("--grad-clip", type=float, default=d.grad_clip)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="autocast (default: on GPU)")
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the training step in a CUDA graph, which removes the CPU launch overhead that "
                        "bounds small models (default: on for one CUDA process without FSDP)")
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="run folder (default runs/train/<mechanism...>)")
    g.add_argument("--save-every", type=int, default=d.save_every, help="resume-state interval in steps")
    g.add_argument("--log-every", type=int, default=d.log_every)
    g.add_argument("--eval-sequences", type=int, default=d.eval_sequences)
    g.add_argument("--time-budget-s", type=float, default=None,
                   help="fit the step count into this many seconds (measured after a few steps)")
    g.add_argument("--stop-after", type=int, default=None, help="leave after this global step (resume later)")
    g.add_argument("--stop-at-s", type=float, default=None, help="leave after this many seconds of this run, "
                   "saving a resumable state (the schedule is not shortened, unlike --time-budget-s)")
    g.add_argument("--save-every-s", type=float, default=d.save_every_s,
                   help=f"also save the resume state at least this often, in seconds (default {d.save_every_s:g})")
    g.add_argument("--keep-state", action="store_true", help="keep state.pt after a finished run")
    g.add_argument("--force", action="store_true", help="train again although --out holds a finished run "
                   "(its checkpoint and log are replaced)")
    g.add_argument("--fsdp", action="store_true", help="shard backbone and new parameters over the processes "
                   "(FSDP2, one unit per decoder layer); also on with an accelerate FSDP config")
    g.add_argument("--note", default=None, help="free text stored in the config (e.g. why fewer tokens)")


def linearize_options(args) -> dict:
    from models.spec import parse_full_layers
    full = list(parse_full_layers(args.full_layers)) if args.full_layers else None
    scores = None
    if args.layer_scores:
        path = Path(args.layer_scores)
        if not path.exists():
            raise FileNotFoundError(f"--layer-scores file {str(path)!r} does not exist")
        try:
            scores = json.loads(path.read_text())["layer_scores"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"--layer-scores file {str(path)!r} is not a `golinear diagnose` layer_scores JSON "
                             f"({type(e).__name__}: {e})") from None
        if not (isinstance(scores, list) and all(isinstance(x, (int, float)) for x in scores)):
            raise ValueError(f"--layer-scores file {str(path)!r}: 'layer_scores' must be a list of numbers")
    return dict(mechanism=args.mechanism, window=args.window, sinks=args.sinks, short_conv=args.short_conv,
                lora=args.lora, full_layers=full, keep_full=args.keep_full, select=args.select, layer_scores=scores)


def run_name(opts: dict) -> str:
    parts = [opts["mechanism"]]
    if opts["window"]:
        parts.append(f"w{opts['window']}")
    if opts["sinks"]:
        parts.append(f"s{opts['sinks']}")
    if opts["short_conv"]:
        parts.append("sc")
    if opts["lora"]:
        parts.append("lora")
    return "-".join(parts)


def train_config_from_args(args) -> TrainConfig:
    return TrainConfig(seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, lr=args.lr,
                       lora_lr=args.lora_lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
                       min_lr_ratio=args.min_lr_ratio, grad_clip=args.grad_clip, seed=args.seed,
                       save_every=args.save_every, save_every_s=args.save_every_s, log_every=args.log_every,
                       eval_sequences=args.eval_sequences,
                       time_budget_s=args.time_budget_s, stop_after=args.stop_after, stop_at_s=args.stop_at_s,
                       bf16=args.bf16, cuda_graph=args.cuda_graph)


def load_token_data(args, tokenizer, train_tokens: int, heldout_tokens: int) -> data_mod.TokenData:
    if args.tokens and Path(args.tokens).exists():
        td = data_mod.TokenData.load(args.tokens)
        fp = data_mod.tokenizer_fingerprint(tokenizer)
        if td.meta.get("tokenizer_fingerprint") != fp:
            raise ValueError(f"token file {args.tokens!r} was made with tokenizer {td.meta.get('tokenizer')!r} "
                             f"({td.meta.get('tokenizer_fingerprint')}), not this backbone's ({fp})")
        return td
    if args.dataset:
        td = data_mod.prepare_hf(tokenizer, args.dataset, args.dataset_config, args.dataset_split, args.text_field,
                                 args.dataset_files, train_tokens=train_tokens, heldout_fraction=args.heldout_fraction,
                                 heldout_tokens=heldout_tokens, seed=args.seed)
    else:
        td = data_mod.prepare_books(tokenizer, args.data_dir, train_tokens=train_tokens, heldout_docs=args.heldout_docs,
                                    heldout_tokens=heldout_tokens, seed=args.seed)
    if args.tokens:
        td.save(args.tokens)
    return td


def main(args) -> int:
    from accelerate import Accelerator
    from models.backbone import load_backbone, load_tokenizer

    t_start = time.perf_counter()  # a time budget counts from here (model loading and evals included)
    cfg = train_config_from_args(args)
    cfg.validate()
    opts = linearize_options(args)
    out = Path(args.out or Path("runs") / "train" / run_name(opts))
    check_inputs(args, opts)  # before any data preparation, model loading or folder creation
    if not args.prepare_only and finished_run(out, args, cfg, opts):
        return 0
    acc = Accelerator(cpu=not torch.cuda.is_available())
    fsdp = fsdp_settings(getattr(args, "fsdp", False), acc.num_processes)
    if fsdp and acc.mixed_precision != "no":
        raise ValueError(f"mixed_precision {acc.mixed_precision!r} with FSDP: golinear autocasts itself (--bf16, on "
                         "by default on GPU); set mixed_precision: 'no' in the accelerate config")
    needed = cfg.steps * cfg.batch_size * acc.num_processes * cfg.seq_len + cfg.seq_len
    train_tokens = args.prepare_train_tokens or needed
    heldout_tokens = cfg.eval_sequences * cfg.seq_len
    if args.prepare_only:
        if not args.tokens:
            raise ValueError("--prepare-only needs --tokens FILE")
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
        print(json.dumps({k: v for k, v in td.meta.items() if k != "heldout_ids"}))
        return 0

    from models.checkpoint import save_checkpoint
    from models.linearize import LinearizeConfig, linearize

    out.mkdir(parents=True, exist_ok=True)
    if args.force and acc.is_main_process:  # start over: the old state and log go, the checkpoint is replaced
        (out / STATE_FILE).unlink(missing_ok=True)
        (out / LOG_FILE).unlink(missing_ok=True)
    acc.wait_for_everyone()
    lin_cfg = LinearizeConfig.from_dict(opts)
    if acc.is_main_process:  # the tokenizer-and-pack step runs once; other ranks read the token file
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
    acc.wait_for_everyone()
    if not acc.is_main_process:
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
    sequences = data_mod.PackedSequences(td.train, cfg.seq_len, seed=cfg.seed)
    heldout = data_mod.heldout_sequences(td.heldout, cfg.seq_len, cfg.eval_sequences)

    bf16 = cfg.bf16 if cfg.bf16 is not None else acc.device.type == "cuda"
    resuming = (out / STATE_FILE).exists()
    previous = read_json(out / CONFIG_FILE) if resuming and (out / CONFIG_FILE).exists() else {}
    full_loss = previous.get("results", {}).get("heldout_loss_full_attention")
    if fsdp:
        model, attention_modules = load_sharded(args.base, lin_cfg, cfg.seed, acc, fsdp)
    else:
        model, _ = load_backbone(args.base, dtype="float32", device=acc.device)
        if full_loss is None and acc.is_main_process:
            full_loss = heldout_loss(model, heldout, acc.device, bf16)
        seed_everything(cfg.seed)  # new-parameter initialisation is a function of the seed
        linearize(model, lin_cfg, base_name=args.base)
    init_loss = previous.get("results", {}).get("heldout_loss_init")
    data_meta = {k: v for k, v in td.meta.items()}
    data_meta.update(sequences=sequences.num, seq_len=cfg.seq_len,
                     epochs=round(sequences.epochs_for(cfg.steps * cfg.batch_size * acc.num_processes), 4))
    t_eval = time.perf_counter()
    if init_loss is None and acc.is_main_process and not fsdp:
        init_loss = heldout_loss(model, heldout, acc.device, bf16)
    trainer = Trainer(model, sequences, cfg, out, accelerator=acc, meta={"data": data_meta})
    if fsdp:  # the sharded model is evaluated by all ranks together
        t_eval = time.perf_counter()
        if full_loss is None:
            full_loss = trainer.evaluate(heldout, attention_modules=attention_modules)
        if init_loss is None:
            init_loss = trainer.evaluate(heldout)
    eval_s = time.perf_counter() - t_eval  # includes kernel compilation on a fresh GPU: capped below
    if cfg.time_budget_s and not resuming:  # leave time for the final evaluation and saving
        trainer.deadline = t_start + cfg.time_budget_s - (min(eval_s, 30.0) + 10.0)
    trainer.try_resume()
    summary = trainer.train()
    results = {"heldout_loss_full_attention": full_loss, "heldout_loss_init": init_loss,
               "heldout_sequences": int(heldout.shape[0]), "heldout_tokens_scored": int(heldout.numel() - heldout.shape[0])}
    record = {"command": "golinear train", "base": args.base, "linearize": lin_cfg.to_dict(), "train": dataclasses.asdict(cfg),
              "data": data_meta, "seeds": {"init": cfg.seed, "data_order": cfg.seed, "heldout": "hash rule, no seed"},
              "note": args.note, "environment": environment(acc, fsdp), "summary": summary, "results": results}
    if not summary["finished"]:
        if acc.is_main_process:
            atomic_write_json(out / CONFIG_FILE, record)
            print(f"stopped at step {summary['step']}/{summary['total_steps']}; re-run the same command to resume")
        return 0
    if fsdp or acc.is_main_process:  # under FSDP every rank takes part in the forward and the gathering
        results["heldout_loss_trained"] = trainer.evaluate(heldout)
        new_params = trainer.full_new_parameters()
    if acc.is_main_process:
        record["summary"]["total_wall_s_this_invocation"] = round(time.perf_counter() - t_start, 2)
        record["new_parameters"] = int(sum(p.numel() for p in trainer.named.values()))
        save_checkpoint(model, out, tensors=new_params,
                        extra={"training": {k: record[k] for k in ("train", "seeds", "note", "summary", "results")}})
        atomic_write_json(out / CONFIG_FILE, record)
        plot_loss(read_log(out / LOG_FILE), out / PLOT_FILE,
                  title=f"{args.base} {run_name(opts)}: {summary['tokens'] / 1e6:.1f}M tokens",
                  heldout={"held-out, full attention": full_loss, "held-out, linearized (trained)":
                           results["heldout_loss_trained"], "held-out, linearized (init)": init_loss})
        if not args.keep_state and (out / STATE_FILE).exists():
            (out / STATE_FILE).unlink()
        print(json.dumps({"out": str(out), **results, "tokens": summary["tokens"],
                          "train_wall_s": summary["train_wall_s"], "tokens_per_s": summary["tokens_per_s"]}))
    acc.wait_for_everyone()
    return 0


def check_inputs(args, opts: dict) -> None:
    """Everything checkable without weights: linearize options against the backbone's config, the token
    file or the books corpus (present, matching the data folder's SHA256SUMS, gzip complete)."""
    from models.data_hashes import verify_files
    from models.spec import check_linearize
    check_linearize(opts, args.base)
    if args.tokens and Path(args.tokens).exists():
        return
    if args.dataset is None:
        data_dir = data_mod.resolve_data_dir(args.data_dir)
        verify_files(data_mod.book_files(data_dir), data_dir)


def finished_run(out: Path, args, cfg: TrainConfig, opts: dict) -> bool:
    """True (and says so) when `out` holds a finished run of these settings: re-running it is a no-op.

    A finished run of other settings is an error (use another --out, or --force to replace it)."""
    from models.linearize import LinearizeConfig
    record_path = out / CONFIG_FILE
    if args.force or not record_path.exists():
        return False
    record = read_json(record_path)
    if not (record.get("summary") or {}).get("finished") or not (out / "new_params.safetensors").exists():
        return False
    want = {"base": args.base, "linearize": LinearizeConfig.from_dict(opts).to_dict(),
            "steps": cfg.steps, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "seed": cfg.seed}
    have = {"base": record.get("base"), "linearize": record.get("linearize"),
            **{k: (record.get("train") or {}).get(k) for k in ("steps", "seq_len", "batch_size", "seed")}}
    diff = sorted(k for k in want if json.dumps(want[k], sort_keys=True) != json.dumps(have[k], sort_keys=True))
    if diff:
        raise ValueError(f"run folder {str(out)!r} holds a finished run with other settings ({', '.join(diff)}); "
                         "choose another --out, or --force to replace it")
    s = record["summary"]
    print(f"golinear train: {out} already holds this finished run ({s.get('step')} steps, "
          f"{s.get('tokens')} tokens); nothing to do (--force trains it again)")
    return True


def environment(acc, fsdp: dict | None = None) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(acc.device),
           "processes": acc.num_processes, "fsdp": fsdp}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env
