"""Does the delta push (`weight_transport.delta_codec: xor-zlib`) pay here? The option against whole pushes,
on the code the system runs (`asyncrl.core.weights.delta`), in one sitting.

Consecutive weight versions come from real AdamW steps (the demo's lr, 5e-5).
  transport  : a kept broadcast group (`BroadcastGroups`) from this process to `--receivers` receiver processes
               that land every bucket in bucket-shaped buffers, as the torch engine does; for (a) the demo
               model and (b) a 214 MB model-shaped set of tensors, each in float32 and in bfloat16. Per cell:
               whole_s / delta_s (median push, Begin-less: sender start to every receiver done),
               delta_bytes / bytes, and break_even_MBps: the link speed below which the delta wins,
               (bytes - delta_bytes) / (delta_s - whole_s);
  end_to_end : the production path (controller process, replica processes with torch engines on the demo
               model, `WeightPublisher` here, gRPC + gloo), `--pushes` pushes with the option off and on.

    .venv/bin/python bench/delta_push.py [--receivers 2] [--big-mb 204] [--trials 3] [--pushes 20]
    (or: asyncrl bench delta_push)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time

import torch
from common import emit
from push_fixed_cost import demo_config, push_system
from weight_push import model_like_metas

LR = 5e-5


def adam_steps(tensors: list[torch.Tensor], steps: int) -> list[list[torch.Tensor]]:
    """`steps + 1` consecutive versions of `tensors`, one real AdamW step on a random linear loss apart."""
    params = [torch.nn.Parameter(t.clone()) for t in tensors]
    optimizer = torch.optim.AdamW(params, lr=LR)
    versions = [[p.detach().clone() for p in params]]
    for _ in range(steps):
        optimizer.zero_grad()
        sum((p * torch.randn_like(p)).sum() for p in params).backward()
        optimizer.step()
        versions.append([p.detach().clone() for p in params])
    return versions


def receiver(rank: int, inbox, done) -> None:
    from asyncrl.core.weights.flat import FlatWeights
    from asyncrl.core.weights.groups import BroadcastGroups
    from asyncrl.core.weights.transport import receive_weights

    torch.set_num_threads(1)
    groups, into = BroadcastGroups(), None
    while (plan := inbox.get()) is not None:
        into = into if into is not None and into.matches(plan.tensors, plan.bucket_bytes) else FlatWeights(
            plan.tensors, plan.bucket_bytes)
        with groups.member(plan, rank) as group:
            for _ in receive_weights(group, plan, into=into):
                pass
        done.put(rank)


def transport_cell(versions: list[list[torch.Tensor]], receivers: int) -> dict:
    """Push every version in turn on one kept group, whole and then with the delta codec; time each push."""
    from asyncrl.core.weights.groups import BroadcastGroups
    from asyncrl.core.weights.plan import PushPlan, tensor_metas
    from asyncrl.core.weights.transport import host_store, send_weights

    named = [[(f"t{i}", t) for i, t in enumerate(version)] for version in versions]
    metas = tensor_metas(named[0])
    ctx = mp.get_context("spawn")
    out = {}
    for codec in ("", "xor-zlib"):
        store = host_store("127.0.0.1", 0, 120)
        sender, done = BroadcastGroups(store), ctx.Queue()
        inboxes = [ctx.Queue() for _ in range(receivers)]
        procs = [ctx.Process(target=receiver, args=(r + 1, inboxes[r], done)) for r in range(receivers)]
        for proc in procs:
            proc.start()
        times, sizes, previous = [], [], ""
        for k, version in enumerate(named):
            plan = PushPlan(f"p{k}", k, f"127.0.0.1:{store.port}", receivers + 1, "gloo", metas, 64 << 20, 120,
                            group_id="g", new_group=k == 0, delta_codec=codec,
                            delta_base_push_id=previous if codec else "")  # fmt: skip
            t0 = time.perf_counter()
            for inbox in inboxes:
                inbox.put(plan)
            with sender.member(plan, 0) as group:
                sizes.append(send_weights(group, version, plan))
            for _ in range(receivers):
                done.get(timeout=600)
            times.append(time.perf_counter() - t0)
            previous = plan.push_id
        for inbox in inboxes:
            inbox.put(None)
        for proc in procs:
            proc.join(60)
        sender.close()
        out["delta" if codec else "whole"] = (statistics.median(times[1:]), statistics.median(sizes[1:]))
    (whole_s, nbytes), (delta_s, delta_bytes) = out["whole"], out["delta"]
    return {
        "bytes": nbytes, "whole_s": round(whole_s, 4), "delta_s": round(delta_s, 4),
        "delta_bytes": delta_bytes, "ratio": round(delta_bytes / nbytes, 3),
        "delta_over_whole": round(delta_s / whole_s, 1),
        "break_even_MBps": round((nbytes - delta_bytes) / max(delta_s - whole_s, 1e-9) / 2**20, 1),
    }


def end_to_end(args, codec: str) -> dict:
    """Median push (Begin to committed) of the demo model through controller and replica processes, with a
    real AdamW step of the learner between pushes."""
    from asyncrl.core.modeling import load_causal_lm
    from asyncrl.learner.publisher import WeightPublisher

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = demo_config(run_dir)
        cfg.learner.weight_transport.delta_codec = codec
        with push_system(cfg, args.receivers) as (stub, _):
            model = load_causal_lm(cfg.model.path)
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
            publisher = WeightPublisher(stub, model, cfg.learner.weight_transport, cfg.controller.push_timeout_s)
            results = []
            for version in range(1, args.pushes + 2):
                optimizer.zero_grad()
                sum((p * torch.randn_like(p)).sum() for p in model.parameters()).backward()
                optimizer.step()
                result = publisher.push(version)
                assert result.committed and len(result.acked) == args.receivers, result
                results.append(result)
            publisher.close()
    steady = results[1:]
    return {"push_s": round(statistics.median(r.total_s for r in steady), 5),
            "bytes": int(statistics.median(r.bytes_sent for r in steady)),
            "deltas": sum(r.delta for r in steady), "pushes": len(steady)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--big-mb", type=float, default=204)
    parser.add_argument("--trials", type=int, default=3, help="timed pushes per transport cell")
    parser.add_argument("--pushes", type=int, default=20, help="timed pushes per end-to-end setting")
    args = parser.parse_args()
    from asyncrl.core.modeling import load_causal_lm

    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as run_dir:  # builds the demo model when it is not there yet
        demo = [p.detach() for p in load_causal_lm(demo_config(run_dir).model.path).parameters()]
    big = [torch.randn(m.shape) * 0.02 for m in model_like_metas(args.big_mb)]
    transport = {}
    for name, tensors in (("demo_model", demo), ("model_214MB", big)):
        versions = adam_steps(tensors, args.trials)
        for dtype in (torch.float32, torch.bfloat16):
            cast = [[t.to(dtype) for t in version] for version in versions]
            transport[f"{name} {str(dtype).removeprefix('torch.')}"] = transport_cell(cast, args.receivers)
    e2e = {"whole": end_to_end(args, "none"), "delta": end_to_end(args, "xor-zlib")}
    e2e["delta_over_whole"] = round(e2e["delta"]["push_s"] / e2e["whole"]["push_s"], 2)
    bars = {cell: result["delta_over_whole"] for cell, result in transport.items()}
    bars["end to end, demo float32"] = e2e["delta_over_whole"]
    emit("delta_push", {"transport": transport, "end_to_end": e2e, "receivers": args.receivers,
                        "trials": args.trials, "lr": LR, "codec": "xor-zlib"},
         bars, "delta push time / whole push time",
         "Delta push (xor-zlib) against the whole push (>1: slower; pays only on slow links)")


if __name__ == "__main__":
    main()
