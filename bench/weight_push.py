"""Weight-push bandwidth vs a raw broadcast of the same bytes on the same gloo group.

Rank 0 (the learner side) and `--receivers` receiver processes form ONE group. Per trial:
  raw      : broadcast one flat buffer holding all the model's bytes (the best this group can do);
  push     : asyncrl's path as the learner and the torch engine run it -- the sender's weights live in
             bucket-shaped storage (`push.flat.bind_parameters`), so send_weights broadcasts each bucket as
             it is; receivers land every bucket straight in their spare buffers (`receive_weights(into=...)`),
             which an engine then swaps in by pointer;
  push_copy: the path with copies on both ends -- weights in ordinary tensors packed into staging buffers,
             received into staging and copied into the receiver's own parameters (what a vLLM
             `load_weights` does).
All end with a tiny all-reduce so the time covers receipt on every rank, not just the send.
Prints JSON: median seconds of each, GB/s, and push_fraction_of_raw = raw_s / push_s (target >= 0.9).

  .venv/bin/python bench/weight_push.py [--mb 200] [--receivers 2] [--bucket-mb 64] [--trials 5]
  .venv/bin/python bench/weight_push.py --size 0.5b --trials 3   # Qwen2.5-0.5B's tensors (1.98 GB), output
                                                                  # weight_push-0.5b.json
On the sender and on each receiver the tensors of every path are views of one buffer, so a 0.5B model costs
two copies of its bytes per process (the flat buffer and the bucket-shaped one), not three.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch
from common import emit

from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.flat import FlatWeights
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import receive_weights, send_weights


def model_like_metas(total_mb: float, hidden: int = 1024) -> tuple[TensorMeta, ...]:
    """Transformer-shaped tensors (attention, MLP, norms) adding up to about total_mb MiB of float32."""
    metas, layer = [], 0
    per_layer = [("q_proj.weight", (hidden, hidden)), ("k_proj.weight", (hidden // 4, hidden)),
                 ("v_proj.weight", (hidden // 4, hidden)), ("o_proj.weight", (hidden, hidden)),
                 ("gate_proj.weight", (2 * hidden, hidden)), ("up_proj.weight", (2 * hidden, hidden)),
                 ("down_proj.weight", (hidden, 2 * hidden)), ("input_layernorm.weight", (hidden,)),
                 ("post_attention_layernorm.weight", (hidden,))]
    while sum(m.nbytes for m in metas) < total_mb * 2**20:
        metas += [TensorMeta(f"layers.{layer}.{n}", s, "float32") for n, s in per_layer]
        layer += 1
    return tuple(metas)


def half_billion_metas() -> tuple[TensorMeta, ...]:
    """The parameters the learner pushes for Qwen2.5-0.5B's shape (the tied embedding once), from a model built
    on the meta device: shapes only, no memory."""
    from common import qwen2_half_billion_config
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_half_billion_config())
    return tuple(TensorMeta(name, tuple(p.shape), "float32") for name, p in model.named_parameters())


def views_of(flat: torch.Tensor, metas: tuple[TensorMeta, ...]) -> list[tuple[str, torch.Tensor]]:
    """Each tensor of `metas` as a view into `flat`, one after the other."""
    out, offset = [], 0
    for m in metas:
        n = m.nbytes // 4
        out.append((m.name, flat[offset:offset + n].view(m.shape)))
        offset += n
    return out


def _done(group) -> None:
    flag = torch.ones(1)
    opts = torch.distributed.AllreduceOptions()
    group._pg.allreduce([flag], opts).wait()


def receiver(plan: PushPlan, rank: int, trials: int) -> None:
    group = make_group(plan, rank)
    spare = FlatWeights(plan.tensors, plan.bucket_bytes)
    flat = torch.empty(plan.total_bytes // 4)
    params = dict(views_of(flat, plan.tensors))  # the copy path's own parameters; the raw path overwrites them
    for _ in range(trials):
        group.broadcast(flat)
        _done(group)
        for _bucket in receive_weights(group, plan, into=spare):
            pass
        _done(group)
        for bucket in receive_weights(group, plan):
            for name, tensor in bucket:
                params[name].copy_(tensor)
        _done(group)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=("mb", "0.5b"), default="mb",
                    help="mb: transformer-shaped tensors of --mb MiB; 0.5b: Qwen2.5-0.5B's parameters")
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=64)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    metas = half_billion_metas() if args.size == "0.5b" else model_like_metas(args.mb)
    store = host_store("127.0.0.1", 0, 120)
    plan = PushPlan(push_id="bench", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=args.receivers + 1, transport="gloo", tensors=metas,
                    bucket_bytes=int(args.bucket_mb * 2**20), timeout_s=120)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=receiver, args=(plan, r, args.trials + 1)) for r in range(1, args.receivers + 1)]
    for p in procs:
        p.start()
    group = make_group(plan, 0, store)
    flat = torch.randn(plan.total_bytes // 4)
    named = views_of(flat, metas)  # ordinary tensors: the copy path packs them into staging
    bound = FlatWeights(metas, plan.bucket_bytes)  # the learner's weights after bind_parameters
    for name, tensor in named:
        bound.views[name].copy_(tensor)
    raw, push, push_copy = [], [], []
    for trial in range(args.trials + 1):  # trial 0 warms up connections and allocators
        t0 = time.perf_counter()
        group.broadcast(flat)
        _done(group)
        t1 = time.perf_counter()
        send_weights(group, bound.named(), plan)
        _done(group)
        t2 = time.perf_counter()
        send_weights(group, named, plan)
        _done(group)
        t3 = time.perf_counter()
        if trial:
            raw.append(t1 - t0)
            push.append(t2 - t1)
            push_copy.append(t3 - t2)
    for p in procs:
        p.join(timeout=60)
    gb = plan.total_bytes / 1e9
    raw_s, push_s, copy_s = statistics.median(raw), statistics.median(push), statistics.median(push_copy)
    result = {
        "bench": "weight_push", "size": args.size, "bytes": plan.total_bytes, "tensors": len(metas), "receivers": args.receivers,
        "bucket_mb": args.bucket_mb, "trials": args.trials, "raw_broadcast_s": round(raw_s, 4),
        "push_s": round(push_s, 4), "push_copy_s": round(copy_s, 4), "raw_GBps": round(gb / raw_s, 3),
        "push_GBps": round(gb / push_s, 3), "push_copy_GBps": round(gb / copy_s, 3),
        "push_fraction_of_raw": round(raw_s / push_s, 3), "push_copy_fraction_of_raw": round(raw_s / copy_s, 3),
        "target": 0.9,
    }
    emit("weight_push" if args.size == "mb" else f"weight_push-{args.size}", result, {"raw broadcast": gb / raw_s, "push (zero-copy)": gb / push_s,
                                 "push (pack+copy)": gb / copy_s},
         "GB/s", f"{plan.total_bytes / 2**20:.0f} MiB to {args.receivers} receivers over gloo "
                 f"(push/raw {raw_s / push_s:.2f})")


if __name__ == "__main__":
    main()
