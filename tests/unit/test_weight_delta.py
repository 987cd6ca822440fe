"""The delta codec (`asyncrl.core.weights.delta`): lossless, smaller than the bytes when little changed, and
every malformed payload refused."""

import zlib

import numpy as np
import pytest
import torch

from asyncrl.core.weights.delta import CODECS, DeltaBase, max_payload_bytes


def after_a_step(t: torch.Tensor, frac: float = 1.0, seed: int = 1) -> torch.Tensor:
    """`t` after a small optimizer-like update of a fraction of its values."""
    g = torch.Generator().manual_seed(seed)
    changed = torch.rand(t.shape, generator=g) < frac
    return torch.where(changed, t + 1e-4 * torch.randn(t.shape, generator=g).to(t.dtype), t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_delta_restores_the_exact_bytes_and_moves_the_base_on(dtype):
    old = torch.randn(4097, generator=torch.Generator().manual_seed(0)).to(dtype)
    sender, receiver = DeltaBase("xor-zlib"), DeltaBase("xor-zlib")
    sender.keep(0, old)
    receiver.keep(0, old)
    for seed in (1, 2, 3):  # consecutive versions: each delta is against the previous one
        new = after_a_step(old, seed=seed)
        payload = sender.encode(0, new)
        out = torch.empty_like(new)
        receiver.decode(0, payload, out)
        assert torch.equal(out.view(torch.uint8), new.view(torch.uint8))
        old = new


def test_the_byte_planes_compress_what_did_not_change():
    """Unchanged values XOR to zero; changed float32 values only differ in low mantissa bytes."""
    old = torch.randn(1 << 16, generator=torch.Generator().manual_seed(0))
    base = DeltaBase("xor-zlib")
    base.keep(0, old)
    assert base.encode(0, old.clone()).numel() < 0.01 * old.numel() * 4  # nothing changed: a run of zeros
    base.keep(0, old)
    half = base.encode(0, after_a_step(old, frac=0.5)).numel()
    assert half < 0.6 * old.numel() * 4


def test_a_hand_built_delta_decodes_by_the_formula():
    """new = base XOR unshuffle(inflate(payload)), byte planes: all first bytes, then all second bytes."""
    base_values = torch.tensor([1, 2, 3], dtype=torch.int16)
    xor = np.array([0x0100, 0x0000, 0x00FF], dtype="<i2").view(np.uint8)  # little-endian bytes per element
    planes = xor.reshape(-1, 2).T.copy()  # [[0x00, 0x00, 0xFF], [0x01, 0x00, 0x00]]
    receiver = DeltaBase("xor-zlib")
    receiver.keep(0, base_values)
    out = torch.empty(3, dtype=torch.int16)
    receiver.decode(0, torch.frombuffer(bytearray(zlib.compress(planes.tobytes())), dtype=torch.uint8), out)
    assert out.tolist() == [1 ^ 0x0100, 2, 3 ^ 0x00FF]


def test_malformed_payloads_and_missing_bases_are_refused():
    base = DeltaBase("xor-zlib")
    base.keep(0, torch.zeros(64))
    out = torch.empty(64)

    def payload(data: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    with pytest.raises(ValueError, match="not a zlib stream"):
        base.decode(0, payload(b"not zlib at all"), out)
    with pytest.raises(ValueError, match="256 bytes"):  # too short
        base.decode(0, payload(zlib.compress(bytes(100))), out)
    with pytest.raises(ValueError, match="256 bytes"):  # a bomb: far more than the bucket, never inflated
        base.decode(0, payload(zlib.compress(bytes(1 << 24))), out)
    with pytest.raises(ValueError, match="256 bytes"):  # truncated stream
        base.decode(0, payload(zlib.compress(bytes(256))[:-4]), out)
    with pytest.raises(ValueError, match="no base"):
        base.decode(1, payload(zlib.compress(bytes(256))), out)
    with pytest.raises(ValueError, match="no base of 128 bytes"):
        base.decode(0, payload(zlib.compress(bytes(128))), torch.empty(32))
    with pytest.raises(ValueError, match="unknown delta codec"):
        DeltaBase("lz4")
    assert CODECS == ("xor-zlib",)


def test_the_length_bound_covers_incompressible_bytes():
    for n in (1, 1000, 1 << 16, (1 << 20) + 7):
        noise = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
        assert len(zlib.compress(noise, 1)) <= max_payload_bytes(n)
