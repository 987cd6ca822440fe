"""Half-precision runs (`model.dtype` float16 or bfloat16) on a single-rank learner: float32 master weights.

The engines hold the weights in half precision. The learner keeps them in float32, the weights the optimizer
steps, the checkpoint saves and a push sends (each engine rounds them to its dtype as it copies them in), and
runs every forward on their half-precision rounding (`HalfForwards`): the same numbers, in the same dtype, as
an engine's forward with the pushed weights. The rounding is a differentiable cast, so gradients reach the
float32 weights; AdamW on half-precision weights would lose every update smaller than half a unit in the last
place (float16: its epsilon underflows to 0, the first step's update is infinite).

float16 gradients underflow where bfloat16's do not (5 exponent bits to 8): its losses are scaled up before
backward and the gradients scaled back down before clipping (`LossScale`, the usual dynamic loss scale).
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.utils.stateless import _reparametrize_module

HALF_DTYPES = (torch.float16, torch.bfloat16)


class HalfForwards:
    """Within `running(model)`, the model's parameters are their rounding to `dtype` (tied weights stay tied)."""

    def __init__(self, dtype: torch.dtype):
        if dtype not in HALF_DTYPES:
            raise ValueError(f"half-precision forwards take float16 or bfloat16, not {dtype}")
        self.dtype = dtype

    @contextlib.contextmanager
    def running(self, model: torch.nn.Module):
        rounded = {name: p.to(self.dtype) for name, p in model.named_parameters()}
        with _reparametrize_module(model, rounded, tie_weights=True):
            yield


class LossScale:
    """Dynamic loss scaling: losses are multiplied by `scale` before backward, gradients divided by it after. An
    update whose gradients overflowed is skipped (the trainer's non-finite check) and halves the scale; every
    `growth_interval` finite updates in a row double it."""

    def __init__(self, initial: float = 2.0**16, growth_interval: int = 200, enabled: bool = True):
        self.scale = float(initial) if enabled else 1.0
        self.enabled = enabled
        self.growth_interval = growth_interval
        self._good = 0

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, params) -> None:
        if not self.enabled:
            return
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)

    def update(self, finite: bool) -> None:
        """After each update: halve on overflow (at least 1), double after `growth_interval` finite ones."""
        if not self.enabled:
            return
        if not finite:
            self.scale, self._good = max(1.0, self.scale / 2), 0
            return
        self._good += 1
        if self._good >= self.growth_interval:
            self.scale, self._good = self.scale * 2, 0
