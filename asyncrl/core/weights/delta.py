"""Delta pushes: send only what changed since the previous push on a broadcast group, compressed.

One bucket under the `xor-zlib` codec: XOR its new bytes with the same bucket of the base (the bytes every
member holds from the group's previous push), regroup the result by byte plane (all first bytes of the
elements, then all second bytes, ...: an optimizer step leaves signs and exponents alone, so those planes are
almost all zeros), and compress with zlib at level 1. The receiver inverts each stage and XORs with its own
base: lossless, it ends with the sender's exact bytes.

The base lives with the kept group (`weights.groups.BroadcastGroups`), one copy of the weights in bucket
layout on every member, named by the push that delivered it. A push may be a delta only when the controller
saw every member acknowledge that push (the plan's `delta_base_push_id`); a new group, a failed push or a
member without that base falls back to a whole push. On the wire (`weights.transport`) a delta bucket is two
broadcasts: its compressed length (one int64), then the compressed bytes.

The encoding runs on the CPU (numpy, zlib releases the GIL). It costs far more than a loopback or datacenter
link saves: it pays only on links slower than the figures in docs/benchmarks.md (`bench/delta_push.py`).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from asyncrl.core.weights.kinds import CODECS

ZLIB_LEVEL = 1
"""Fastest zlib level: at higher levels the encode costs several times more for a few percent of bytes."""


def max_payload_bytes(nbytes: int) -> int:
    """An upper bound on zlib's output for `nbytes` of input (stored blocks at worst: 5 bytes per 16 KiB block
    plus the stream header), so a receiver can refuse a length no honest sender announces."""
    return nbytes + 5 * (nbytes // 16384 + 1) + 64


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array (shared with the tensor when it is on the CPU)."""
    return tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


class DeltaBase:
    """The bytes of every bucket as of push `push_id` ("" while none, or while a push is rewriting them)."""

    def __init__(self, codec: str):
        if codec not in CODECS:
            raise ValueError(f"unknown delta codec {codec!r} (expected one of {CODECS})")
        self.codec = codec
        self.push_id = ""
        self._buckets: dict[int, np.ndarray] = {}

    def holds(self, push_id: str) -> bool:
        return bool(push_id) and self.push_id == push_id

    def keep(self, k: int, bucket: torch.Tensor) -> None:
        """Remember bucket `k` as sent or received whole."""
        data = _bytes_of(bucket)
        held = self._buckets.get(k)
        if held is None or held.size != data.size:
            self._buckets[k] = data.copy()
        else:
            np.copyto(held, data)

    def encode(self, k: int, bucket: torch.Tensor) -> torch.Tensor:
        """Sender: the compressed delta of bucket `k` against the base (a uint8 CPU tensor); the base becomes
        the new bytes."""
        new, base = _bytes_of(bucket), self._base(k, bucket)
        planes = np.bitwise_xor(new, base).reshape(-1, bucket.element_size()).T
        payload = zlib.compress(np.ascontiguousarray(planes), ZLIB_LEVEL)
        np.copyto(base, new)
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8)

    def decode(self, k: int, payload: torch.Tensor, out: torch.Tensor) -> None:
        """Receiver: write bucket `k` (the base XOR the decompressed delta) into `out`; the base becomes the
        new bytes. Raises ValueError for a payload that does not decompress to exactly the bucket's size."""
        base = self._base(k, out)
        inflater = zlib.decompressobj()
        try:
            planes = inflater.decompress(_bytes_of(payload), base.size)  # at most the bucket's size
        except zlib.error as err:
            raise ValueError(f"delta of bucket {k}: not a zlib stream ({err})") from None
        if len(planes) != base.size or not inflater.eof or inflater.unconsumed_tail:
            raise ValueError(f"delta of bucket {k}: does not decompress to the bucket's {base.size} bytes")
        xor = np.frombuffer(planes, dtype=np.uint8).reshape(out.element_size(), -1).T.reshape(-1)
        np.bitwise_xor(base, xor, out=base)
        out.copy_(torch.from_numpy(base).view(out.dtype).view(out.shape))

    def _base(self, k: int, like: torch.Tensor) -> np.ndarray:
        base = self._buckets.get(k)
        nbytes = like.numel() * like.element_size()
        if base is None or base.size != nbytes:
            raise ValueError(f"delta of bucket {k}: no base of {nbytes} bytes (push {self.push_id or '-'})")
        return base
