"""The checksum of what a push carries, full weights or an adapter: the learner names it at the commit, every
receiver answers with the checksum of what it received and now serves, and the controller fails a receiver
whose answer differs (a push altered on the way, or one that did not take effect). SHA-256 over each tensor's
name, dtype, shape and bytes, in the push's order; fed tensor by tensor, so a receiver that loads bucket by
bucket checks as the buckets arrive."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


class WeightsChecksum:
    def __init__(self):
        self._digest = hashlib.sha256()

    def update(self, name: str, tensor: torch.Tensor) -> None:
        self._digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{tuple(tensor.shape)}\n".encode())
        data = tensor.detach().to("cpu").contiguous()
        if data.numel():
            self._digest.update(data.view(-1).view(torch.uint8).numpy())  # the buffer itself, not a copy

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def weights_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The checksum (hex) of `named_tensors` in the order given (the push's)."""
    checksum = WeightsChecksum()
    for name, tensor in named_tensors:
        checksum.update(name, tensor)
    return checksum.hexdigest()


class WeightsAltered(ValueError):
    """What a receiver got is not what the sender sent (a push altered on the way): it serves none of it."""


def check_as_sent(received: str, sent: str, version: int) -> None:
    """Raise WeightsAltered unless the checksum of what arrived is the one the sender wrote for the push."""
    if received != sent:
        raise WeightsAltered(f"the push of version {version} arrived with checksum {received[:12]}, the learner "
                             f"sent {sent[:12]}: not served")
