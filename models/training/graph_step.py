"""One training step (forward, backward, gradient clipping, AdamW) captured once in a CUDA graph, then replayed.

Why: on the H200 a SmolLM2-size linearized training step is bound by the CPU launching thousands of small
kernels (torch.profiler on an H200: ~6.8k per step, the GPU busy ~25 % of it); a graph replays
them all with one launch. What capture needs, and gets here: a static input buffer; AdamW with
`capturable=True` and tensor learning rates (the schedule writes into them); autocast without its weight
cache; no host synchronisation inside the step. The warm-up steps that capture needs (Triton autotuning,
lazy allocations, the optimizer's state) run on a snapshot that is restored afterwards, so a graphed run
takes exactly the steps an eager run takes.
"""
from __future__ import annotations

import torch

from golinear.models.training.distill import training_loss


def make_capturable(optimizer, device) -> None:
    """Learning rates as device tensors (read by the captured AdamW on every replay), capturable on, and the
    state (a resumed run's, loaded on the CPU) on the device."""
    for g in optimizer.param_groups:
        g["lr"] = torch.tensor(float(g["lr"]), device=device)
        g["capturable"] = True
    for s in optimizer.state.values():
        for k, v in s.items():
            if torch.is_tensor(v):
                s[k] = v.to(device, torch.float32 if k == "step" else v.dtype)


def make_eager(optimizer) -> None:
    """The inverse, for an eager run resuming a graphed run's state: float learning rates, CPU step counts."""
    for g in optimizer.param_groups:
        g["lr"] = float(g["lr"])
        g["capturable"] = False
    for s in optimizer.state.values():
        if torch.is_tensor(s.get("step")):
            s["step"] = s["step"].detach().to("cpu", torch.float32)


def require_trainable(loss) -> None:
    """A loss no trainable parameter reaches cannot train: say why instead of failing inside backward."""
    if not loss.requires_grad:
        raise ValueError("no trainable parameter affects the loss (is seq_len <= window + sinks, "
                         "leaving the linear path no tokens?)")


def set_lr(group: dict, value: float) -> None:
    """Write a learning rate in place when it is a tensor (a captured graph holds that tensor)."""
    if torch.is_tensor(group["lr"]):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


class GraphedTrainStep:
    """`step(ids) -> (loss, grad_norm)`: device tensors, overwritten by the next replay (copy to keep)."""

    def __init__(self, model, optimizer, params: list, grad_clip: float, bf16: bool, example_ids, warmup: int = 2,
                 loss_fn=training_loss):
        self.model, self.optimizer, self.params = model, optimizer, list(params)
        self.grad_clip, self.bf16, self.loss_fn = grad_clip, bf16, loss_fn
        self.ids = example_ids.detach().clone()
        saved = self._snapshot()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    loss, _ = self._step()
                    require_trainable(loss)
                    self.optimizer.zero_grad(set_to_none=True)
                del loss  # its autograd graph would keep warm-up (side-stream) gradient nodes alive into capture
        finally:  # a failed warm-up leaves the run as it was
            torch.cuda.current_stream().wait_stream(side)
            self._restore(saved)
            self.optimizer.zero_grad(set_to_none=True)
        # capture records kernels without running them: if it fails, nothing has changed either
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            # gradients are None here, so backward allocates them in the graph's pool and every replay
            # overwrites them: no zero_grad inside the graph
            loss, self.grad_norm = self._step()
            self.loss = loss.detach()

    def _step(self):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            loss = self.loss_fn(self.model, self.ids)
        if loss.requires_grad:
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        self.optimizer.step()
        return loss, norm

    def _snapshot(self) -> dict:
        return {"params": [p.detach().clone() for p in self.params],
                "state": {p: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                          for p, s in self.optimizer.state.items()}}

    @torch.no_grad()
    def _restore(self, saved: dict) -> None:
        """Parameters back; optimizer state back in place (tensors the graph will hold), or zero where the
        warm-up created it (AdamW's fresh state: step 0, zero moments)."""
        for p, v in zip(self.params, saved["params"]):
            p.copy_(v)
        for p, s in self.optimizer.state.items():
            old = saved["state"].get(p, {})
            for k, v in s.items():
                if torch.is_tensor(v):
                    v.copy_(old[k]) if k in old else v.zero_()

    def __call__(self, ids):
        self.ids.copy_(ids, non_blocking=True)
        self.graph.replay()
        return self.loss, self.grad_norm
