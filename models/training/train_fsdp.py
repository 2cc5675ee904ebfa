"""FSDP set-up of `golinear train` (models.training.train): settings from `--fsdp` or accelerate's FSDP config,
FSDP2 sharding (one unit per decoder layer plus the root), rank-0-only loading, and moving tensors
between full and sharded layouts (checkpoints and the resume state hold full tensors)."""
from __future__ import annotations

import contextlib
import os

import torch

from golinear.models.training.train_utils import seed_everything


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
    from golinear.models.attention.projection import decoder_layers

    layers = decoder_layers(model)
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
    from golinear.models.backbones.backbone import check_architecture, resolve
    config = transformers.AutoConfig.from_pretrained(resolve(name_or_path))
    check_architecture(config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def load_sharded(base: str, lin_cfg, seed: int, acc, fsdp: dict):
    """(sharded linearized model, original attention modules). Only rank 0 reads the backbone (host memory:
    one fp32 copy, not one per process); the other ranks build it on the meta device; after sharding, rank
    0 broadcasts every tensor and each rank keeps its shard. New-parameter init = a one-process run's.
    A random-weight folder (models.backbones.random_base) is read by nobody: every rank draws its own shards."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from golinear.models.backbones import random_base
    from golinear.models.backbones.backbone import load_backbone, resolve
    from golinear.models.attention.linearize import linearize, new_parameters
    from golinear.models.attention.projection import decoder_layers

    rnd = random_base.read_spec(resolve(base))
    if acc.is_main_process and rnd is None:
        model, _ = load_backbone(base, dtype="float32", device="cpu")
    else:
        model = backbone_skeleton(base)
    attention_modules = [layer.self_attn for layer in decoder_layers(model)]
    plan = random_base.plan(model) if rnd else None
    seed_everything(seed)  # new-parameter initialisation is a function of the seed (rank 0's is kept)
    with random_base.new_parameters_on_cpu(model) if rnd else contextlib.nullcontext():
        linearize(model, lin_cfg, base_name=base)
    new_full = {n: p.detach().clone() for n, p in new_parameters(model).items()} if rnd else {}
    full = model.state_dict() if acc.is_main_process and not rnd else {}
    saved_buffers = random_base.real_buffers(model) if rnd else {}
    shard_model(model, acc.device, acc.num_processes, **fsdp)
    if not acc.is_main_process or rnd:
        model.to_empty(device=acc.device)
    if rnd:
        model.config.golinear["base_fingerprint"] = random_base.fill_sharded(model, plan, rnd["seed"], acc.device,
                                                                             new_full)
        random_base.restore_buffers(model, acc.device, saved_buffers)
        return model, attention_modules
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


@contextlib.contextmanager
def full_attention(model, attention_modules: list):
    """Run `model` with its original softmax attention modules (they share the frozen q/k/v/o projections,
    so under FSDP the layer's unit gathers them as usual): the full-attention reference of a sharded model."""
    from golinear.models.attention.projection import decoder_layers
    layers = decoder_layers(model)
    current = [layer.self_attn for layer in layers]
    for layer, attn in zip(layers, attention_modules):
        layer.self_attn = attn
    try:
        yield model
    finally:
        for layer, attn in zip(layers, current):
            layer.self_attn = attn
