"""Would a delta push pay here? Sending only what changed since the last push (XOR against the previous
weights, byte planes shuffled, zlib level 1, as several RL stacks do), against sending the weights whole.

Two consecutive weight versions come from one real AdamW step (lr of the demo, 5e-5) on (a) the demo model
and (b) a 214 MB model-shaped set of float32 tensors; each in float32 and in bfloat16. Measured in one sitting:
  raw_broadcast_s : a gloo broadcast of the whole weights from this process to `--receivers` processes;
  encode_s        : XOR + byte shuffle + compress on the sender;   decode_s: the inverse on a receiver;
  ratio           : compressed bytes / weight bytes;
  break_even_MBps : the link speed below which the delta wins: (bytes - compressed) / (encode_s + decode_s).

    .venv/bin/python bench/delta_push.py [--receivers 2] [--big-mb 204]
    (or: asyncrl bench delta_push)
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib

import numpy as np
import torch
from common import emit
from push_fixed_cost import demo_config, raw_broadcast_s
from weight_push import model_like_metas


def adam_step(tensors: list[torch.Tensor], lr: float = 5e-5) -> list[torch.Tensor]:
    """The tensors after one real AdamW step on a random quadratic loss."""
    params = [torch.nn.Parameter(t.clone()) for t in tensors]
    optimizer = torch.optim.AdamW(params, lr=lr)
    loss = sum((p * torch.randn_like(p)).sum() for p in params)
    loss.backward()
    optimizer.step()
    return [p.detach() for p in params]


def encode(new: np.ndarray, old: np.ndarray) -> bytes:
    xor = np.bitwise_xor(new, old)
    planes = np.ascontiguousarray(xor.view(np.uint8).reshape(-1, xor.itemsize).T)
    return zlib.compress(planes.tobytes(), 1)


def decode(payload: bytes, old: np.ndarray) -> np.ndarray:
    planes = np.frombuffer(zlib.decompress(payload), dtype=np.uint8).reshape(old.itemsize, -1)
    return np.bitwise_xor(np.ascontiguousarray(planes.T).view(old.dtype).reshape(-1), old)


def measure(name: str, before: list[torch.Tensor], after: list[torch.Tensor], receivers: int) -> dict:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        old = torch.cat([t.flatten() for t in before]).to(dtype).view(torch.int32 if dtype == torch.float32
                                                                      else torch.int16).numpy()
        new = torch.cat([t.flatten() for t in after]).to(dtype).view(torch.int32 if dtype == torch.float32
                                                                     else torch.int16).numpy()
        t0 = time.perf_counter()
        payload = encode(new, old)
        encode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        restored = decode(payload, old)
        decode_s = time.perf_counter() - t0
        assert np.array_equal(restored, new)
        raw = raw_broadcast_s(new.nbytes // 4, receivers, 5)
        saved = new.nbytes - len(payload)
        out[str(dtype).removeprefix("torch.")] = {
            "bytes": new.nbytes, "ratio": round(len(payload) / new.nbytes, 3),
            "unchanged_frac": round(float(np.mean(new == old)), 3),
            "encode_s": round(encode_s, 4), "decode_s": round(decode_s, 4), "raw_broadcast_s": round(raw, 4),
            "delta_over_raw": round((encode_s + decode_s) / raw, 1),
            "break_even_MBps": round(saved / (encode_s + decode_s) / 2**20, 1),
        }
    return {name: out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--big-mb", type=float, default=204)
    args = parser.parse_args()
    from asyncrl.core.modeling import load_causal_lm

    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as run_dir:  # builds the demo model when it is not there yet
        demo = [p.detach() for p in load_causal_lm(demo_config(run_dir).model.path).parameters()]
    big = [torch.randn(m.shape) * 0.02 for m in model_like_metas(args.big_mb)]
    result = {**measure("demo_model", demo, adam_step(demo), args.receivers),
              **measure("model_214MB", big, adam_step(big), args.receivers)}
    bars = {f"{model} {dtype}": cell["delta_over_raw"] for model, cells in result.items()
            for dtype, cell in cells.items()}
    emit("delta_push", {**result, "receivers": args.receivers}, bars, "delta encode+decode / raw broadcast",
         "XOR + shuffle + zlib delta against a whole push (times slower; <1 would pay)")


if __name__ == "__main__":
    main()
