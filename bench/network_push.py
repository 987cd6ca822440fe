"""A weight push over thin links: the production data path (`make_group`, `send_weights`, `receive_weights`)
between hosts of their own (`asyncrl.tools.netlab`, root), every host's link capped at `--mbit` both ways, the
learner's included, as on a cloud network where each machine has its own bandwidth.

For each transport (gloo: a broadcast from the learner; gloo-relay: passed on from replica to replica, bucket
by bucket) and each number of replicas (1 and `--replicas`), `--repeats` pushes of `--mb` MB of float32
tensors in `--bucket-mb` buckets; a push's time runs from the sender's first bucket (the group is formed
already) to the last replica's last byte. Reported: the median seconds of each, the floor one copy takes at
the cap (`mb * 8 / mbit`), and for each transport the ratio of N replicas to one (the target is 1.3x).

    sudo .venv/bin/python bench/network_push.py [--mbit 200] [--mb 64] [--bucket-mb 4] [--replicas 3]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import time

STORE_PORT = 29400


def payload(mb: float, filled: bool = True) -> list:
    """`mb` MB of float32 in 16 tensors (unfilled: for their shapes only)."""
    import torch

    count = 16
    numel = int(mb * 2**20 / 4 / count)
    return [(f"w{i}", torch.full((numel,), float(i)) if filled else torch.empty(numel)) for i in range(count)]


def plan_for(push_id: str, store: str, store_key: bytes, world: int, transport: str, mb: float, bucket_mb: float):
    from asyncrl.core.wire.push_contract import tensor_metas
    from asyncrl.push.plan import PushPlan

    return PushPlan(push_id=push_id, version=1, store_address=store, store_key=store_key, world_size=world, transport=transport,
                    tensors=tensor_metas(payload(mb, filled=False)), bucket_bytes=int(bucket_mb * 2**20),
                    timeout_s=600)


def rank_main(args) -> None:
    """One rank of `--repeats` pushes (inside its host's namespace): prints a JSON line of its times."""
    from asyncrl.core.wire.grpc_util import address_refuses
    from asyncrl.push.broadcast import host_store, make_group
    from asyncrl.push.transfer import receive_weights, send_weights

    host, port = args.store.rsplit(":", 1)
    key = bytes.fromhex(args.store_key)
    store = host_store(host, int(port), 600, key) if args.rank == 0 else None
    while args.rank > 0 and address_refuses(args.store):  # the sender's store starts with its rank
        time.sleep(0.1)
    named = payload(args.mb) if args.rank == 0 else None
    times = []
    for repeat in range(args.repeats):
        plan = plan_for(f"push-{repeat}", args.store, key, args.world, args.transport, args.mb, args.bucket_mb)
        group = make_group(plan, args.rank, store)
        if args.rank == 0:
            times.append(time.time())
            send_weights(group, named, plan)
        else:
            for _bucket in receive_weights(group, plan):
                pass
            times.append(time.time())
        group.close()
    print(json.dumps({"rank": args.rank, "times": times}), flush=True)


def one_setting(lab, transport: str, replicas: int, args, port: int) -> list[float]:
    store = f"{lab.hosts['learner'].address}:{port}"
    common = ["--store", store, "--store-key", secrets.token_hex(32), "--world", str(replicas + 1),
              "--transport", transport, "--mb", str(args.mb), "--bucket-mb", str(args.bucket_mb), "--repeats", str(args.repeats)]
    hosts = ["learner", *(f"replica-{i}" for i in range(replicas))]
    procs = [lab.run(host, [sys.executable, __file__, "--role", "rank", "--rank", str(rank), *common],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, host in enumerate(hosts)]
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1200)
        assert proc.returncode == 0, f"a rank failed ({proc.returncode}): {out[-2000:]}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    starts = next(o["times"] for o in outs if o["rank"] == 0)
    ends = [max(o["times"][r] for o in outs if o["rank"] > 0) for r in range(args.repeats)]
    return [end - start for start, end in zip(starts, ends)]


def measure(args) -> dict:
    from asyncrl.tools.netlab import Lab

    seconds: dict[str, dict[str, float]] = {}
    with Lab() as lab:
        for host in ["learner", *(f"replica-{i}" for i in range(args.replicas))]:
            lab.add_host(host)
            lab.shape(host, args.mbit)
        port = STORE_PORT
        for transport in ("gloo", "gloo-relay"):
            for replicas in sorted({1, args.replicas}):
                port += 1
                times = one_setting(lab, transport, replicas, args, port)
                seconds.setdefault(transport, {})[str(replicas)] = statistics.median(times)
                print(f"{transport:10s} {replicas} replicas: " + ", ".join(f"{t:.2f}" for t in times) + " s",
                      flush=True)
    floor = args.mb * 2**20 * 8 / (args.mbit * 1e6)
    n = str(args.replicas)
    return {
        "mbit": args.mbit, "mb": args.mb, "bucket_mb": args.bucket_mb, "replicas": args.replicas,
        "repeats": args.repeats, "floor_s": floor, "seconds": seconds,
        "n_over_one": {t: seconds[t][n] / seconds[t]["1"] for t in seconds},
        "relay_over_broadcast": seconds["gloo-relay"][n] / seconds["gloo"][n],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", default="bench", choices=("bench", "rank"))
    parser.add_argument("--mbit", type=float, default=200.0)
    parser.add_argument("--mb", type=float, default=64.0)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store", default="")
    parser.add_argument("--store-key", default="", help="the store's key in hex (the bench makes one per setting)")
    parser.add_argument("--transport", default="gloo")
    args = parser.parse_args()
    if args.role == "rank":
        rank_main(args)
        return
    from common import emit

    result = measure(args)
    n = args.replicas
    bars = {f"{t} x{k}": s for t, by in result["seconds"].items() for k, s in by.items()}
    bars["floor (one copy at the cap)"] = result["floor_s"]
    emit("network_push", result, bars, "seconds per push",
         f"{args.mb:.0f} MB push, every link at {args.mbit:.0f} Mb/s: {n} replicas over 1 = "
         f"{result['n_over_one']['gloo']:.2f}x broadcast, {result['n_over_one']['gloo-relay']:.2f}x relayed")


if __name__ == "__main__":
    main()
