"""Fuzz every RPC of every service with malformed requests, as an outside client holding the token would:
each one breaks a rule (out-of-range numbers, NaN and inf, huge or hostile strings, oversized lists, unknown
ids) or is not a message at all (the Learner's one RPC takes an empty message: only bytes apply there). None is accepted, each gets a fitting status (never UNKNOWN or INTERNAL), no
error echoes a huge input back, and every service still serves a valid request afterwards."""

from __future__ import annotations

import math
import random

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.v1 import (
    controller_pb2,
    controller_pb2_grpc,
    rollout_pb2,
    teacher_pb2,
    weights_pb2,
)
from tests.conftest import TEST_AUTH, TEST_STORE_KEY
from tests.integration.test_auth import METHODS

pytestmark = pytest.mark.integration

FITTING = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE}
BIG = "x" * 1_000_000
I64 = 2**63 - 1
I32 = 2**31 - 1
BAD_ADDRESSES = ["", "nohost", "host:0", "host:99999", "host:-1", ":80", BIG + ":1", "<script>alert(1)</script>:80",
                 "evil host:80", "a/b:80", "[::1:80", "host:80\n", "h" * 300 + ":80"]
BAD_FLOATS = [-1.0, math.nan, math.inf, -math.inf]


def controller_cases():
    c = controller_pb2
    cases = []
    for address in BAD_ADDRESSES:
        cases.append(("RegisterReplica", c.RegisterReplicaRequest(address=address, engine="torch")))
    for replica_id in ["-x", "a" * 200, "bad id", "x\n", "é", BIG]:
        cases.append(("RegisterReplica", c.RegisterReplicaRequest(address="127.0.0.1:9", replica_id=replica_id)))
    for version in [-1, I64]:  # a version ahead of the controller is valid: a resync follows
        cases.append(("RegisterReplica", c.RegisterReplicaRequest(address="127.0.0.1:9", weight_version=version)))
    for engine in ["bad engine", "e" * 300, BIG]:
        cases.append(("RegisterReplica", c.RegisterReplicaRequest(address="127.0.0.1:9", engine=engine)))
    for replica_id in ["", "nobody", BIG]:
        cases.append(("Heartbeat", c.HeartbeatRequest(replica_id=replica_id)))
        cases.append(("AcquireLease", c.AcquireLeaseRequest(replica_id=replica_id, num_trajectories=1)))
        cases.append(("CompleteLease", c.CompleteLeaseRequest(replica_id=replica_id, lease_id="lease-1")))
    for held in [["bad id"], ["l"] * 5000, [BIG]]:
        cases.append(("Heartbeat", c.HeartbeatRequest(replica_id="nobody", held_leases=c.HeldLeases(lease_ids=held))))
    for n in [0, -5, I32, 10_000]:
        cases.append(("AcquireLease", c.AcquireLeaseRequest(replica_id="nobody", num_trajectories=n)))
    for wait in BAD_FLOATS:
        cases.append(("AcquireLease", c.AcquireLeaseRequest(replica_id="nobody", num_trajectories=1, wait_s=wait)))
    for lease_id, written in [("", 0), (BIG, 0), ("nope", 0), ("lease-1", -1), ("lease-1", I32)]:
        cases.append(("CompleteLease", c.CompleteLeaseRequest(replica_id="nobody", lease_id=lease_id,
                                                              num_written=written)))
    for n, most, wait in [(0, 1, 0.0), (1, 0, 0.0), (1, -3, 0.0), (1, I32, 0.0), (I32, 1, 0.0),
                          *[(1, 2, f) for f in BAD_FLOATS]]:
        cases.append(("AcquireLeases", c.AcquireLeasesRequest(replica_id="nobody", num_trajectories=n,
                                                              max_leases=most, wait_s=wait)))
    for completions in [[], [c.LeaseCompletion(lease_id="l")] * 5000, [c.LeaseCompletion(lease_id=BIG)],
                        [c.LeaseCompletion(lease_id="l", num_written=-1)], [c.LeaseCompletion(lease_id="l"),
                        c.LeaseCompletion(lease_id="l")], [c.LeaseCompletion(lease_id="l", num_written=I32)],
                        [c.LeaseCompletion(lease_id="nope")]]:
        cases.append(("CompleteLeases", c.CompleteLeasesRequest(replica_id="nobody", completions=completions)))
    tensor = weights_pb2.TensorSpec(name="w", shape=[2, 2], dtype="float32")
    good_push = {"version": 1, "store_address": "127.0.0.1:29500", "store_key": TEST_STORE_KEY, "transport": "gloo",
                 "bucket_bytes": 1 << 20, "tensors": [tensor]}
    for change in [{"version": -1}, {"version": I64}, {"version": 1_000}, *[{"store_address": a} for a in
                   BAD_ADDRESSES], {"store_key": b""}, {"store_key": b"k" * 4096}, {"transport": ""}, {"transport": "tcp"}, {"transport": BIG}, {"bucket_bytes": 0},
                   {"bucket_bytes": -1}, {"bucket_bytes": 2**62}, *[{"timeout_s": f} for f in BAD_FLOATS],
                   *[{"join_timeout_s": f} for f in BAD_FLOATS], {"tensors": []},
                   {"tensors": [weights_pb2.TensorSpec(name="", shape=[2], dtype="float32")]},
                   {"tensors": [weights_pb2.TensorSpec(name="w", shape=[-2], dtype="float32")]},
                   {"tensors": [weights_pb2.TensorSpec(name="w", shape=[2], dtype="complex512")]},
                   {"tensors": [weights_pb2.TensorSpec(name=BIG, shape=[2], dtype="float32")]},
                   {"tensors": [weights_pb2.TensorSpec(name="w", shape=[I64, I64], dtype="float32")]},
                   {"unused_push_id": BIG}, {"unused_push_id": "push\nv2"}]:
        cases.append(("BeginWeightPush", c.BeginWeightPushRequest(**{**good_push, **change})))
    for push_id, error in [("", ""), (BIG, ""), ("unknown-push", ""), ("unknown-push", BIG)]:
        cases.append(("CommitWeightPush", c.CommitWeightPushRequest(push_id=push_id, error=error)))
        cases.append(("CommitWeightPush", c.CommitWeightPushRequest(push_id=push_id, error=error, reserve_next=True)))
    for seconds in BAD_FLOATS:
        cases.append(("CommitWeightPush", c.CommitWeightPushRequest(push_id="unknown-push", push_seconds=seconds)))
    for ack in [weights_pb2.PushAck(rank=-1), weights_pb2.PushAck(rank=I64 % 2**31), weights_pb2.PushAck(rank=1, weight_version=-I64),
                weights_pb2.PushAck(rank=1, ack_mac=BIG.encode()), weights_pb2.PushAck(rank=1, error=BIG),
                weights_pb2.PushAck(rank=1, ack_mac=b"x" * 32)]:  # fmt: skip
        cases.append(("CommitWeightPush", c.CommitWeightPushRequest(push_id="unknown-push", acks=[ack])))
    for field in ("step", "version", "consumed"):
        for value in [-1, I64]:
            cases.append(("LearnerHeartbeat", c.LearnerHeartbeatRequest(**{field: value})))
    for address in BAD_ADDRESSES:
        cases.append(("RegisterLearner", c.RegisterLearnerRequest(address=address)))
    # Learner-only calls without the seated learner's key: a caller with the token cannot move the run.
    for key in [b"", b"x" * 32, BIG.encode()]:
        cases.append(("ResetTimeline", c.ResetTimelineRequest(learner_key=key)))
        cases.append(("BeginWeightPush", c.BeginWeightPushRequest(**good_push, learner_key=key)))
        cases.append(("LearnerHeartbeat", c.LearnerHeartbeatRequest(learner_key=key)))
        cases.append(("ReturnQuota", c.ReturnQuotaRequest(entry_id="1-0", trajectories=1, learner_key=key)))
        cases.append(("AwaitLeases", c.AwaitLeasesRequest(version=0, learner_key=key)))
    return [("controller", f"/asyncrl.v1.Controller/{m}", r) for m, r in cases]


def rollout_cases(vocab: int, context: int):
    r = rollout_pb2
    plan = weights_pb2.WeightPushPlan(push_id="p", version=1, store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, world_size=2,
                                      transport="gloo", bucket_bytes=1 << 20)
    cases = [("UpdateWeights", r.UpdateWeightsRequest(rank=1))]
    for rank in [0, -1, 2, I32]:
        cases.append(("UpdateWeights", r.UpdateWeightsRequest(plan=plan, rank=rank)))
    for change in [{"world_size": 0}, {"world_size": -3}, {"version": -1}, {"store_address": BIG + ":1"},
                   {"store_address": "x"}, {"store_key": b""}, {"store_key": b"k" * 31}, {"transport": "tcp"},
                   {"bucket_bytes": 0}, {"push_id": ""},
                   {"push_id": BIG}]:
        bad = weights_pb2.WeightPushPlan()
        bad.CopyFrom(plan)
        for key, value in change.items():
            setattr(bad, key, value)
        cases.append(("UpdateWeights", r.UpdateWeightsRequest(plan=bad, rank=1)))
    prompt = lambda ids: r.PromptTokens(token_ids=ids)
    for prompts in [[], [prompt([])], [prompt([-1])], [prompt([vocab])], [prompt([1] * (context + 5))],
                    [prompt([1, 2])] * 100_000]:
        cases.append(("Generate", r.GenerateRequest(prompts=prompts, max_new_tokens=4, temperature=1.0)))
    for max_new in [0, -1, I32, context]:
        cases.append(("Generate", r.GenerateRequest(prompts=[prompt([1, 2])], max_new_tokens=max_new, temperature=1)))
    for temperature in [*BAD_FLOATS, 1e-45, 1e30]:
        cases.append(("Generate", r.GenerateRequest(prompts=[prompt([1, 2])], max_new_tokens=4,
                                                    temperature=temperature)))
    return [("rollout", f"/asyncrl.v1.Rollout/{m}", q) for m, q in cases]


def teacher_cases(vocab: int, context: int):
    t = teacher_pb2
    seq = lambda ids, start: t.ScoreSequence(token_ids=ids, response_start=start)
    cases = [t.ScoreRequest(sequences=[]), t.ScoreRequest(sequences=[seq([1, 2, 3], 0)]),
             t.ScoreRequest(sequences=[seq([1, 2, 3], 4)]), t.ScoreRequest(sequences=[seq([1, 2, 3], -1)]),
             t.ScoreRequest(sequences=[seq([1, vocab, 3], 1)]), t.ScoreRequest(sequences=[seq([-2, 1], 1)]),
             t.ScoreRequest(sequences=[seq([], 0)]), t.ScoreRequest(sequences=[seq([1] * (context + 10), 1)]),
             t.ScoreRequest(sequences=[seq([1] * 40, 1)] * 100_000)]
    return [("teacher", "/asyncrl.v1.Teacher/Score", q) for q in cases]


def undecodable(rng: random.Random, count: int):
    """Bytes no message parses: an invalid wire type, a length past the end, or a truncated varint."""
    for i in range(count):
        body = rng.randbytes(rng.randint(0, 64))
        yield [b"\xff" + body, b"\x0a\xff\x01" + body[:4], b"\x08" + b"\xff" * rng.randint(1, 9)][i % 3]


def call(port: int, method: str, payload: bytes) -> grpc.RpcError | None:
    with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as ch:
        try:
            ch.unary_unary(method)(payload, timeout=60)
        except grpc.RpcError as err:
            return err
    return None


def test_malformed_requests_to_every_rpc_are_refused_with_fitting_statuses(servers, tiny_model_dir):
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(str(tiny_model_dir.policy))
    vocab, context = model_config.vocab_size, model_config.max_position_embeddings
    cases = controller_cases() + rollout_cases(vocab, context) + teacher_cases(vocab, context)
    rng = random.Random(0)
    for service, method in METHODS:
        cases += [(service, method, payload) for payload in undecodable(rng, 30)]
    assert len(cases) >= 500, len(cases)
    wrong, codes = [], {}
    for service, method, request in cases:
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        err = call(servers[service], method, payload)
        if err is not None:
            codes[err.code().name] = codes.get(err.code().name, 0) + 1
        if err is None or err.code() not in FITTING or len(err.details() or "") > 1000:
            shown = None if err is None else (err.code().name, (err.details() or "")[:200])
            wrong.append((method, str(request)[:120] if not isinstance(request, bytes) else request[:16], shown))
    assert not wrong, f"{len(wrong)} of {len(cases)} answered unfittingly: {wrong[:20]}"
    print(f"{len(cases)} malformed requests: {codes}")
    # Still serving: health, and a valid call on the controller.
    for service, port in servers.items():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1, service
    with grpc_channel(f"127.0.0.1:{servers['controller']}", TEST_AUTH) as ch:
        status = controller_pb2_grpc.ControllerStub(ch).GetStatus(controller_pb2.GetStatusRequest(), timeout=10)
    assert status.replicas == [] and status.admitted == 0
