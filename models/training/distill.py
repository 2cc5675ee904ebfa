"""The training loss: next-token cross-entropy, or mixed with a KL to the frozen model's own predictions, or (a
first stage) each layer's attention output matched to the frozen layer's.

Why: the linearized model is trained to replace the backbone, whose next-token distribution at every position is
known for free; cross-entropy on the text only sees the one token that came next. With `golinear train --distill W`
the loss is (1 - W) x cross-entropy + W x KL(teacher || student), the KL summed over the vocabulary and averaged
over every position of the batch. The teacher is the same model with each linearized layer running the frozen
layer's own causal softmax attention (LinearizedAttention.full_attention: the backbone's q/k/v/o projections, no
short conv, LoRA adapters off), under no_grad, so no second copy of the weights is held; its logits are the
backbone's (tests/test_distill.py). The held-out losses a run reports stay cross-entropy, whatever W.

Attention transfer (`golinear train --transfer-steps N`, LoLCATs' first stage): for the first N steps the loss is
the mean over linearized layers of ||y_lin - y_full||^2 / ||y_full||^2, each layer's output against the frozen
layer's softmax attention on the same input, while the residual stream carries the frozen outputs (each layer
learns from the inputs the backbone gives it, not from its linearized predecessors' errors).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from golinear.models.attention.layers import LinearizedAttention, lora_disabled


@contextmanager
def frozen_teacher(model):
    """Inside the block `model` computes what its backbone computed before linearization."""
    layers = [m for m in model.modules() if isinstance(m, LinearizedAttention)]
    for m in layers:
        m.teacher = True
    try:
        with lora_disabled(model):
            yield model
    finally:
        for m in layers:
            m.teacher = False


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, summed over the vocabulary, mean over positions
    (in fp32: bf16 log-probabilities of a 49K vocabulary lose the small terms)."""
    s = F.log_softmax(student_logits.float(), -1)
    t = F.log_softmax(teacher_logits.float(), -1)
    return F.kl_div(s.flatten(0, -2), t.flatten(0, -2), log_target=True, reduction="batchmean")


@contextmanager
def attention_transfer(model):
    """Inside the block each linearized layer returns the frozen attention output and appends its normalised error
    to the list the block yields."""
    layers = [m for m in model.modules() if isinstance(m, LinearizedAttention)]
    errors: list[torch.Tensor] = []
    for m in layers:
        m.transfer = errors
    try:
        yield errors
    finally:
        for m in layers:
            m.transfer = None


def training_loss(model, ids: torch.Tensor, distill: float = 0.0, transfer: bool = False) -> torch.Tensor:
    """The loss one training step minimises (see the module doc); `distill` = W in 0..1; `transfer`: the attention
    outputs' error instead."""
    if transfer:
        with attention_transfer(model) as errors:
            model.model(input_ids=ids, use_cache=False)  # the stream: the backbone's (no logits needed)
        return torch.stack(errors).mean()
    if not distill:
        return model(input_ids=ids, labels=ids, use_cache=False).loss
    with torch.no_grad(), frozen_teacher(model):
        teacher = model(input_ids=ids, use_cache=False).logits
    out = model(input_ids=ids, labels=None if distill == 1 else ids, use_cache=False)
    kl = kl_to_teacher(out.logits, teacher)
    return kl if distill == 1 else (1 - distill) * out.loss + distill * kl


def step_loss(cfg, step: int):
    """Step `step`'s loss function (model, ids) -> loss: attention transfer for the first cfg.transfer_steps steps,
    then cross-entropy mixed with cfg.distill's KL."""
    transfer = step < cfg.transfer_steps
    return functools.partial(training_loss, distill=0.0 if transfer else cfg.distill, transfer=transfer)
