"""The trajectory buffer against its raw limit, one run, one local redis-server: `RedisBuffer` writing real
`TrajectoryGroup`s, serialised, 8 per pipelined round trip (`put_many`, as a replica writes the groups of a
generation batch with rollout.leases_per_batch 8) and reading them in batches of B/G groups with
parsing, acknowledgement and deletion (as the learner does), against raw redis-py on the same bytes with
pipelined XADDs (8 per round trip) and XREADGROUP + pipelined XACK/XDEL without parsing.

Groups: G = 8 trajectories, a 64-token prompt, 256 response tokens each (logp_behav, per-token versions):
about 13 KB serialised. Best of `--trials` for each side, sides alternating. A third side is raw redis-py
serialising each group before its XADD and parsing each entry it reads (the protobuf work the raw side
skips and the buffer cannot): the buffer against it says what the buffer adds over raw Redis plus protobuf,
and its gap to the raw side is protobuf's share. Also timed alone, outside Redis: protobuf encoding and
decoding of the same groups.

    .venv/bin/python bench/buffer_throughput.py [--groups 400] [--trials 3]
    (or: asyncrl bench buffer_throughput)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis
from common import emit

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import BufferConfig
from asyncrl.tools.processes import ProcessGroup
from asyncrl.tools.redis_local import start_local_redis
from asyncrl.v1 import trajectory_pb2

G, PROMPT, RESPONSE, BATCH = 8, 64, 256, 8


def make_group(i: int) -> trajectory_pb2.TrajectoryGroup:
    trajectories = [trajectory_pb2.Trajectory(
        trajectory_id=f"g{i}/{j}", group_id=f"g{i}", prompt_token_ids=list(range(3, 3 + PROMPT)),
        response_token_ids=[(k * 7 + j) % 50 + 3 for k in range(RESPONSE)],
        logp_behav=[-0.01 * ((k + j) % 100) for k in range(RESPONSE)], weight_version=[i // 8] * RESPONSE,
        reward=float(j % 2), finished=True) for j in range(G)]
    return trajectory_pb2.TrajectoryGroup(group_id=f"g{i}", prompt_index=i, replica_id="r", lease_id=f"l{i}",
                                          trajectories=trajectories, created_unix_s=time.time())


def ours(url: str, groups: list, stream: str) -> tuple[float, float]:
    buffer = make_buffer(BufferConfig(type="redis", redis_url=url, stream=stream), consumer="learner-0")
    t0 = time.perf_counter()
    for k in range(0, len(groups), BATCH):
        assert all(isinstance(i, str) for i in buffer.put_many(groups[k : k + BATCH]))
    write_s = time.perf_counter() - t0
    t0, read = time.perf_counter(), 0
    while read < len(groups):
        entries = buffer.get(BATCH, timeout_s=1.0)
        assert all(e.group is not None for e in entries)
        buffer.ack([e.entry_id for e in entries])
        read += len(entries)
    return write_s, time.perf_counter() - t0


def raw(url: str, payloads: list, stream: str, protobuf: bool = False) -> tuple[float, float]:
    """Raw redis-py on `payloads` (bytes); with `protobuf`, on groups serialised before each XADD, every entry
    read parsed."""
    r = redis.Redis.from_url(url)
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    t0 = time.perf_counter()
    for k in range(0, len(payloads), BATCH):
        pipe = r.pipeline(transaction=False)
        for payload in payloads[k : k + BATCH]:
            pipe.xadd(stream, {b"g": payload.SerializeToString() if protobuf else payload})  # the buffer's field
        pipe.execute()
    write_s = time.perf_counter() - t0
    t0, read = time.perf_counter(), 0
    while read < len(payloads):
        reply = r.xreadgroup("g", "c", {stream: ">"}, count=BATCH, block=1000)
        ids = [entry_id for _s, items in reply or [] for entry_id, _f in items]
        if protobuf:
            assert all(trajectory_pb2.TrajectoryGroup.FromString(f[b"g"]).trajectories
                       for _s, items in reply or [] for _id, f in items)
        pipe = r.pipeline(transaction=False)
        pipe.xack(stream, "g", *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
        read += len(ids)
    return write_s, time.perf_counter() - t0


def protobuf_costs(groups: list, payloads: list[bytes], trials: int) -> tuple[float, float]:
    """Best-of-`trials` seconds to serialise every group and to parse every payload (what `ours` does and
    `raw` does not)."""
    encode = decode = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for group in groups:
            group.SerializeToString()
        t1 = time.perf_counter()
        for payload in payloads:
            trajectory_pb2.TrajectoryGroup.FromString(payload)
        encode, decode = min(encode, t1 - t0), min(decode, time.perf_counter() - t1)
    return encode, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    groups = [make_group(i) for i in range(args.groups)]
    payloads = [g.SerializeToString() for g in groups]
    megabytes = sum(len(p) for p in payloads) / 2**20
    best = {"ours": [float("inf")] * 2, "raw": [float("inf")] * 2, "raw_protobuf": [float("inf")] * 2}
    with tempfile.TemporaryDirectory() as tmp:
        processes = ProcessGroup(Path(tmp) / "logs")
        try:
            url = start_local_redis(processes, Path(tmp) / "redis")
            for trial in range(args.trials):
                for side, fn, data in (("ours", ours, groups), ("raw", raw, payloads),
                                       ("raw_protobuf", lambda *a: raw(*a, protobuf=True), groups)):
                    times = fn(url, data, f"bench:{side}:{trial}")
                    best[side] = [min(a, b) for a, b in zip(best[side], times)]
        finally:
            processes.stop_all()
    rate = {side: {"write_mb_s": megabytes / w, "read_mb_s": megabytes / r, "total_mb_s": megabytes / (w + r)}
            for side, (w, r) in best.items()}
    # What the raw side does not do: protobuf encoding (write) and decoding (read) of the same groups.
    encode_s, decode_s = protobuf_costs(groups, payloads, args.trials)
    ours_s, raw_s, raw_protobuf_s = sum(best["ours"]), sum(best["raw"]), sum(best["raw_protobuf"])
    result = {"groups": args.groups, "group_kb": megabytes * 1024 / args.groups, "trials": args.trials, **rate,
              "ratio_write": rate["ours"]["write_mb_s"] / rate["raw"]["write_mb_s"],
              "ratio_read": rate["ours"]["read_mb_s"] / rate["raw"]["read_mb_s"],
              "ratio_total": rate["ours"]["total_mb_s"] / rate["raw"]["total_mb_s"],
              "protobuf_encode_us_per_group": 1e6 * encode_s / args.groups,
              "protobuf_decode_us_per_group": 1e6 * decode_s / args.groups,
              "ratio_total_vs_raw_protobuf": rate["ours"]["total_mb_s"] / rate["raw_protobuf"]["total_mb_s"],
              "protobuf_share_of_gap": (raw_protobuf_s - raw_s) / max(1e-9, ours_s - raw_s),
              "protobuf_alone_share_of_gap": (encode_s + decode_s) / max(1e-9, ours_s - raw_s)}
    emit("buffer_throughput", result,
         {"raw write": rate["raw"]["write_mb_s"], "raw+pb write": rate["raw_protobuf"]["write_mb_s"],
          "ours write": rate["ours"]["write_mb_s"], "raw read": rate["raw"]["read_mb_s"],
          "raw+pb read": rate["raw_protobuf"]["read_mb_s"], "ours read": rate["ours"]["read_mb_s"]},
         "MB/s", f"buffer: {result['ratio_total']:.2f}x raw redis-py write+read, "
                 f"{result['ratio_total_vs_raw_protobuf']:.2f}x raw + protobuf")


if __name__ == "__main__":
    main()
