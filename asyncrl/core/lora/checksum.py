"""The checksum of an adapter: what the learner sent and what a replica's engine serves, compared at every
commit (a push that did not take effect is an error, not a silent no-op) and shown on the status page."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def adapter_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 (hex) over each tensor's name, dtype, shape and bytes, in the order given (the push's)."""
    digest = hashlib.sha256()
    for name, tensor in named_tensors:
        digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{tuple(tensor.shape)}\n".encode())
        data = tensor.detach().to("cpu").contiguous()
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()
