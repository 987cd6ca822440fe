"""The controller over real gRPC (in-process server on port 0): every RPC, health, reflection, validation,
the status page over real HTTP, a real gloo weight push to two in-process Rollout receivers, and `serve`
as a subprocess."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from asyncrl.controller import held_request
from asyncrl.controller.state import ControllerState
from asyncrl.controller.status_page import StatusPage
from asyncrl.core.config.file import dump_config
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.auth import liveness_mac, replica_call_mac
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.learner.seat import SeatedController
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.fanout import STORE_CLIENT_MODULE, TELL_SENDER_TIMEOUT_S, ReplicaChannels
from asyncrl.push.plan import PushPlan
from asyncrl.push.rendezvous import ReceiversMissing
from asyncrl.push.session import ReceiverUnreachable
from asyncrl.push.transfer import receive_weights, send_weights
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.services.controller_service import SERVICE_NAME, create_server
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, rollout_pb2, rollout_pb2_grpc, weights_pb2
from tests.conftest import TEST_AUTH, TEST_LEARNER_SECRET, TEST_STORE_KEY

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def make_config(rollout: dict | None = None, **controller) -> AsyncRLConfig:
    # Replicas registered at version 0 lease at once (most tests here are about the wire, not how a replica
    # earns its leases: test_a_fresh_runs_replica_earns_its_leases_with_the_push_of_version_0).
    fields = {"port": 0, "status_port": 0, "eta": 0, "max_hold_s": 5.0, "push_timeout_s": 30.0,
              "state_store": "none", "trust_initial_weights": True, **controller}
    return AsyncRLConfig.model_validate(
        {"controller": fields, "learner": {"batch_size": 8}, "sampling": {"group_size": 4}, "rollout": rollout or {}}
    )


@dataclass
class Controller:
    stub: SeatedController
    """The controller's stub as the seated learner (learner-only calls carry its key)."""
    channel: grpc.Channel
    state: ControllerState
    address: str
    run_dir: Path


@pytest.fixture
def controller(tmp_path):
    server, port = create_server(make_config(), run_dir=str(tmp_path))
    server.start()
    address = f"127.0.0.1:{port}"
    with grpc_channel(address, TEST_AUTH) as channel:
        stub = SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(channel)), TEST_LEARNER_SECRET)
        # Nothing listens there, so nothing answers its challenges: any learner may take the seat over.
        stub.take_seat("127.0.0.1:1", patience_s=0)
        yield Controller(stub, channel, server.controller_state, address, tmp_path)
    server.stop(0).wait()
    server.controller_state.close()


def register(stub, address="127.0.0.1:9", replica_id="", version=0) -> str:
    request = pb.RegisterReplicaRequest(
        address=address, replica_id=replica_id, weight_version=version, engine="torch"
    )
    return stub.RegisterReplica(request).replica_id


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


# ---- plumbing -------------------------------------------------------------------------------------------


def test_health_is_serving(controller):
    health = health_pb2_grpc.HealthStub(controller.channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_replica_ahead_of_the_controller_is_taken_and_flagged_for_a_resync(controller):
    """Replicas left holding the versions of a timeline the learner reset (it restarted from an older
    checkpoint) register and heartbeat with them: answered, needing a resync, never refused (they used to be
    refused once a second for as long as they lived, and the run sat still)."""
    registration = controller.stub.RegisterReplica(pb.RegisterReplicaRequest(
        address="127.0.0.1:9", weight_version=116, engine="torch"))
    assert registration.needs_sync and registration.current_version == 0
    pulse = controller.stub.Heartbeat(pb.HeartbeatRequest(replica_id=registration.replica_id, weight_version=116))
    assert pulse.needs_sync and pulse.current_version == 0


def test_reflection_lists_the_service(controller):
    stub = reflection_pb2_grpc.ServerReflectionStub(controller.channel)
    answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


# ---- every RPC, happy path --------------------------------------------------------------------------------


@pytest.mark.parametrize("hard_group_size", [0, 8])
def test_a_lease_names_the_hard_prompt_it_samples_again_over_the_wire(tmp_path, hard_group_size):
    """controller.difficulty over gRPC: a completion's mean reward makes its prompt hard, and the next leases
    carry it as sample_index (absent on a lease for the stream's own next prompt), with the group size to
    generate (`num_trajectories`: G = 4, or the hard prompts' 8)."""
    config = make_config(eta=None, difficulty={"replay_share": 0.9, "max_replays": 50,
                                               "hard_group_size": hard_group_size})
    server, port = create_server(config, run_dir=str(tmp_path))
    server.start()
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as channel:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(channel))
            rid = register(stub)
            first = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=1,
                                                               wait_s=0)).leases[0]
            assert not first.HasField("sample_index")
            stub.CompleteLeases(pb.CompleteLeasesRequest(replica_id=rid, completions=[
                pb.LeaseCompletion(lease_id=first.lease_id, num_written=4, reward_mean=0.0)]))
            leases = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=8,
                                                                wait_s=0)).leases
            replays = [lease for lease in leases if lease.HasField("sample_index")]
            assert replays and all(lease.sample_index == first.prompt_index for lease in replays)
            assert all(not lease.HasField("sample_index") for lease in leases if lease not in replays)
            assert first.num_trajectories == 4 and all(lease.num_trajectories == 4 for lease in leases
                                                       if lease not in replays)
            assert all(lease.num_trajectories == (hard_group_size or 4) for lease in replays)
    finally:
        server.stop(0).wait()
        server.controller_state.close()


def test_replica_rpcs_and_lease_lifecycle(controller):
    stub = controller.stub
    registration = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:9", engine="torch"))
    rid = registration.replica_id
    assert rid and registration.current_version == 0 and not registration.needs_sync
    assert registration.heartbeat_interval_s > 0
    assert stub.Heartbeat(pb.HeartbeatRequest(replica_id=rid, weight_version=0)).needs_sync is False
    lease = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
    assert lease.granted and lease.lease_id and lease.prompt_index == 0 and lease.version == 0
    assert lease.expires_unix_s > time.time()
    stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=lease.lease_id, num_written=4))
    second = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
    refused = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0.1))
    assert second.granted and not refused.granted and "staleness bound" in refused.reason
    status = stub.GetStatus(pb.GetStatusRequest())
    assert (status.current_version, status.admitted, status.batch_size, status.eta) == (0, 8, 8, 0)
    assert [r.replica_id for r in status.replicas] == [rid] and status.replicas[0].active_leases == 1
    kinds = [e["kind"] for e in read_events(controller.run_dir, "controller")]
    assert kinds[:4] == ["learner_registered", "replica_registered", "lease_granted", "lease_completed"]


def test_several_leases_per_call(controller):
    stub = controller.stub
    rid = register(stub)
    # B = 8, eta = 0: two leases of 4 fit, a third does not; the answer says why it stopped.
    answer = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=3, wait_s=0))
    assert [lease.prompt_index for lease in answer.leases] == [0, 1]
    assert all(lease.lease_id and lease.version == 0 and lease.expires_unix_s > time.time() for lease in answer.leases)
    assert "staleness bound" in answer.reason
    first, second = answer.leases
    done = stub.CompleteLeases(pb.CompleteLeasesRequest(replica_id=rid, completions=[
        pb.LeaseCompletion(lease_id=first.lease_id, num_written=4), pb.LeaseCompletion(lease_id="lease-gone"),
        pb.LeaseCompletion(lease_id=second.lease_id, num_written=0),
    ]))  # fmt: skip
    assert [(o.lease_id, o.completed) for o in done.outcomes] == [
        (first.lease_id, True), ("lease-gone", False), (second.lease_id, True)]
    assert done.outcomes[1].error.startswith("completions[1].lease_id: unknown lease 'lease-gone'")
    # second's 4 came back: one more lease of 4, then none within wait_s, with the reason.
    again = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=4, wait_s=0))
    assert [lease.prompt_index for lease in again.leases] == [2]
    none = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=4, wait_s=0.1))
    assert list(none.leases) == [] and "staleness bound" in none.reason
    # A malformed completion fails the whole call: the open lease stays open.
    err = rpc_error(stub.CompleteLeases, pb.CompleteLeasesRequest(replica_id=rid, completions=[
        pb.LeaseCompletion(lease_id="lease-gone"), pb.LeaseCompletion(lease_id=again.leases[0].lease_id, num_written=5)]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("completions[1].num_written: must be <= the lease's 4 trajectories, got 5")
    err = rpc_error(stub.CompleteLeases, pb.CompleteLeasesRequest(replica_id=rid, completions=[
        pb.LeaseCompletion(lease_id=again.leases[0].lease_id, num_written=0)] * 2))
    assert err.details().startswith("completions[1].lease_id: the same lease twice")
    assert stub.GetStatus(pb.GetStatusRequest()).replicas[0].active_leases == 1
    grants = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "lease_granted"]
    assert [g["admitted_after"] for g in grants] == [4, 8, 8]


def test_learner_rpcs_with_zero_receivers(controller):
    stub = controller.stub
    begun = stub.BeginWeightPush(
        pb.BeginWeightPushRequest(
            version=1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, transport="gloo", bucket_bytes=1024, timeout_s=5,
            tensors=[weights_pb2.TensorSpec(name="w", shape=[2, 2], dtype="float32")],
        )
    )  # fmt: skip
    assert begun.plan.world_size == 1 and list(begun.receivers) == []
    commit = stub.CommitWeightPush(pb.CommitWeightPushRequest(push_id=begun.plan.push_id, sender_ok=True))
    assert commit.committed and commit.current_version == 1
    pulse = stub.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=1, version=1, consumed=8))
    assert pulse.current_version == 1 and not pulse.sync_requested
    assert stub.GetStatus(pb.GetStatusRequest()).pushes_committed == 1


# ---- validation: INVALID_ARGUMENT naming the field, one case per RPC at least ----------------------------

VALID = "valid-replica"
TENSOR = weights_pb2.TensorSpec(name="w", shape=[2], dtype="float32")


def push_request(**fields):
    base = {"version": 1, "store_address": "127.0.0.1:1", "store_key": TEST_STORE_KEY, "transport": "gloo",
            "bucket_bytes": 64}
    return pb.BeginWeightPushRequest(**{**base, "tensors": [TENSOR], **fields})


INVALID = [
    ("RegisterReplica", pb.RegisterReplicaRequest(address="no-port"), "address: must be host:port"),
    ("RegisterReplica", pb.RegisterReplicaRequest(address="h:1", weight_version=-1), "weight_version: must be in [0, 9007199254740992], got -1"),
    ("RegisterReplica", pb.RegisterReplicaRequest(address="h:1", replica_id="a b"), "replica_id: must be empty or"),
    ("Heartbeat", pb.HeartbeatRequest(replica_id=""), "replica_id: must be a name"),
    ("AcquireLease", pb.AcquireLeaseRequest(replica_id=VALID, num_trajectories=0), "num_trajectories: must be in [1, 8], got 0"),
    ("AcquireLease", pb.AcquireLeaseRequest(replica_id=VALID, num_trajectories=9), "num_trajectories: must be in [1, 8], got 9"),
    ("AcquireLease", pb.AcquireLeaseRequest(replica_id=VALID, num_trajectories=1, wait_s=-1), "wait_s: must be in [0.0, "),
    ("CompleteLease", pb.CompleteLeaseRequest(replica_id=VALID, lease_id=""), "lease_id: must be a name"),
    ("CompleteLease", pb.CompleteLeaseRequest(replica_id=VALID, lease_id="l", num_written=-1), "num_written: must be in [0, 8], got -1"),
    ("AcquireLeases", pb.AcquireLeasesRequest(replica_id=VALID, num_trajectories=1), "max_leases: must be in [1, 8], got 0"),
    ("AcquireLeases", pb.AcquireLeasesRequest(replica_id=VALID, num_trajectories=1, max_leases=9), "max_leases: must be in [1, 8], got 9"),
    ("AcquireLeases", pb.AcquireLeasesRequest(replica_id=VALID, num_trajectories=0, max_leases=1), "num_trajectories: must be in [1, 8], got 0"),
    ("AcquireLeases", pb.AcquireLeasesRequest(replica_id=VALID, num_trajectories=1, max_leases=1, wait_s=math.nan), "wait_s: must be in [0.0, "),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID), "completions: 1 to 4096 entries, got 0"),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID, completions=[pb.LeaseCompletion(lease_id="l"), pb.LeaseCompletion(lease_id="a b")]), "completions[1].lease_id: must be a name"),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID, completions=[pb.LeaseCompletion(lease_id="l"), pb.LeaseCompletion(lease_id="l")]), "completions[1].lease_id: the same lease twice"),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID, completions=[pb.LeaseCompletion(lease_id="l", reward_mean=float("inf"))]), "completions[0].reward_mean: must be in"),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID, completions=[pb.LeaseCompletion(lease_id="l", reward_mean=-2e6)]), "completions[0].reward_mean: must be in"),
    ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=VALID, completions=[pb.LeaseCompletion(lease_id="l", num_written=9)]), "completions[0].num_written: must be in [0, 8], got 9"),
    ("BeginWeightPush", push_request(store_address="nowhere"), "store_address: must be host:port"),
    ("BeginWeightPush", push_request(store_key=b"short"), "store_key: must be the 32-byte key of the learner's store"),
    ("BeginWeightPush", push_request(transport="tcp"), "transport: must be one of"),
    ("BeginWeightPush", push_request(tensors=[]), "tensors: must list 1 to"),
    ("BeginWeightPush", push_request(tensors=[weights_pb2.TensorSpec(name="w", dtype="float99")]), "tensors[0].dtype: unknown torch dtype"),
    ("BeginWeightPush", push_request(tensors=[TENSOR, TENSOR]), "tensors[1].name: duplicate"),
    ("BeginWeightPush", push_request(bucket_bytes=0), "bucket_bytes: must be in [1, "),
    ("BeginWeightPush", push_request(manifest_digest="ab12"), "manifest_digest: must be a SHA-256 digest"),
    ("BeginWeightPush", push_request(manifest_digest="0" * 64), "tensors: must be empty when manifest_digest is set"),
    ("BeginWeightPush", push_request(version=-1), "version: must be in [0, 9007199254740992], got -1"),
    ("BeginWeightPush", push_request(unused_push_id="push v2"), "unused_push_id: must be empty or a name"),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id=""), "push_id: must be a name"),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", push_seconds=-1.0), "push_seconds: must be in [0.0, "),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", push_seconds=math.inf), "push_seconds: must be in [0.0, "),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", acks=[weights_pb2.PushAck(rank=0)]), "acks[0].rank: must be in [1, "),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", acks=[weights_pb2.PushAck(rank=1), weights_pb2.PushAck(rank=1)]), "acks[1].rank: rank 1 is acknowledged twice"),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", acks=[weights_pb2.PushAck(rank=1, weight_version=-1)]), "acks[0].weight_version: must be in [0, "),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", acks=[weights_pb2.PushAck(rank=1, ack_mac=b"m" * 65)]), "acks[0].ack_mac: at most 64 bytes, got 65"),
    ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="p", acks=[weights_pb2.PushAck(rank=1, error="e" * 4097)]), "acks[0].error: at most 4096 characters"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=-1), "step: must be in [0, 9007199254740992], got -1"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(consumed=-5), "consumed: must be in [0, 9007199254740992], got -5"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"busy_fraction": 1.5}), "figures['busy_fraction']: must be in [0.0, 1.0], got 1.5"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"environment_share": 2.0}), "figures['environment_share']: must be in [0.0, 1.0]"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"tool_failure_fraction": -0.1}), "figures['tool_failure_fraction']: must be in"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"truncated_fraction": -0.5}), "figures['truncated_fraction']: must be in [0.0, 1.0], got -0.5"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"length_correct_mean": float("nan")}), "figures['length_correct_mean']: must be"),
    ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, figures={"made_up": 1.0}), "figures['made_up']: is not a figure the learner reports"),
]  # fmt: skip


def test_unknown_replicas_are_not_found(controller):
    # NOT_FOUND tells a replica the controller forgot it (a restart, or dead too long): it registers again.
    for call, request in [(controller.stub.Heartbeat, pb.HeartbeatRequest(replica_id="x")),
                          (controller.stub.AcquireLease, pb.AcquireLeaseRequest(replica_id="x", num_trajectories=1)),
                          (controller.stub.AcquireLeases,
                           pb.AcquireLeasesRequest(replica_id="x", num_trajectories=1, max_leases=2)),
                          (controller.stub.CompleteLeases, pb.CompleteLeasesRequest(
                              replica_id="x", completions=[pb.LeaseCompletion(lease_id="l")]))]:
        err = rpc_error(call, request)
        assert err.code() == grpc.StatusCode.NOT_FOUND and err.details().startswith("replica_id: unknown replica 'x'")


@pytest.mark.parametrize(
    "method, request_, message", INVALID, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(INVALID)]
)
def test_malformed_requests_are_invalid_argument_naming_the_field(controller, method, request_, message):
    register(controller.stub, replica_id=VALID)
    err = rpc_error(getattr(controller.stub, method), request_)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(message), err.details()


def test_state_conflicts_are_failed_precondition(controller):
    stub = controller.stub
    rid = register(stub)
    err = rpc_error(
        stub.CompleteLease, pb.CompleteLeaseRequest(replica_id=rid, lease_id="lease-x", num_written=0)
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "unknown lease 'lease-x'" in err.details()
    err = rpc_error(stub.BeginWeightPush, push_request(version=7))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and err.details().startswith(
        "version: must be 1"
    )
    err = rpc_error(stub.CommitWeightPush, pb.CommitWeightPushRequest(push_id="push-nope", sender_ok=True))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and err.details().startswith("push_id:")


# ---- the learner's seat: only the seated learner pushes, heartbeats as the learner, resets ----------------

LEARNER_ONLY = [("ResetTimeline", pb.ResetTimelineRequest()), ("BeginWeightPush", push_request(version=1)),
                ("CommitWeightPush", pb.CommitWeightPushRequest(push_id="push-1", sender_ok=True)),
                ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(step=1, version=0, consumed=8)),
                ("ReturnQuota", pb.ReturnQuotaRequest(entry_id="1-0", trajectories=4, reason="stale")),
                ("AwaitLeases", pb.AwaitLeasesRequest(version=0))]


@pytest.mark.parametrize("method,request_", LEARNER_ONLY, ids=[m for m, _ in LEARNER_ONLY])
def test_learner_only_calls_need_the_seated_learners_key(controller, method, request_):
    """A caller with the access token but not the seat's key is refused, and nothing changes: the call that
    used to take a live run back to version 0 (an empty ResetTimeline) among them."""
    raw = RegisteredReplica(controller_pb2_grpc.ControllerStub(controller.channel))
    controller.stub.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=3, version=0, consumed=24))
    for key, message in [(b"", "learner_key: missing"), (b"k" * 32, "learner_key: not the key")]:
        request_.learner_key = key
        err = rpc_error(getattr(raw, method), request_)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and err.details().startswith(message), err.details()
    snap = controller.state.snapshot()
    assert snap["current_version"] == 0 and snap["learner"]["step"] == 3
    assert not any(e["kind"] == "timeline_reset" for e in read_events(controller.run_dir, "controller"))


def test_the_seat_stays_with_a_live_learner_and_passes_on_when_it_is_gone(controller):
    """The learner's seat passes to a new learner only when its holder no longer answers a challenge under its
    key; the holder that lost it is refused from its next call on."""
    from asyncrl.services.learner_service import create_server as learner_server

    raw = lambda: SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(controller.channel)), TEST_LEARNER_SECRET)
    first = raw()
    server, port = learner_server(make_config(), seat=first)
    server.start()
    try:
        # The fixture's seat holder serves nothing at its address: the seat passes to `first`.
        first.take_seat(f"127.0.0.1:{port}", patience_s=0)
        err = rpc_error(controller.stub.LearnerHeartbeat, pb.LearnerHeartbeatRequest())
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "another learner took the seat" in err.details()
        second = raw()
        with pytest.raises(grpc.RpcError) as refused:
            second.take_seat("127.0.0.1:2", patience_s=0)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert refused.value.details().startswith(f"address: the learner at 127.0.0.1:{port} holds this run's seat")
        first.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=1))
    finally:
        server.stop(0).wait()
    second.take_seat("127.0.0.1:2", patience_s=0)
    second.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=1))
    assert controller.state.snapshot()["learner"]["address"] == "127.0.0.1:2"  # the status page names it
    err = rpc_error(first.LearnerHeartbeat, pb.LearnerHeartbeatRequest(step=2))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    seats = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "learner_registered"]
    assert [e["address"] for e in seats] == ["127.0.0.1:1", f"127.0.0.1:{port}", "127.0.0.1:2"]


def test_a_learner_out_of_the_controllers_reach_keeps_its_seat_while_it_heartbeats(tmp_path):
    """A holder the controller cannot challenge (its address takes connections and never answers, as behind a
    firewall or with a TLS name mismatch) keeps the seat while it heartbeats: a second learner is told to
    retry (UNAVAILABLE, naming the address), and takes the seat once the holder has been silent for
    controller.heartbeat_timeout_s. Over the patient channel a learner uses: the UNAVAILABLE is not resent
    with the same single-use proof (that came back PERMISSION_DENIED "already used", and the learner died)."""
    server, port = create_server(make_config(heartbeat_timeout_s=5.0), run_dir=str(tmp_path))
    server.start()
    hung = socket.create_server(("127.0.0.1", 0))  # the kernel accepts connections; nothing ever answers
    hung_address = f"127.0.0.1:{hung.getsockname()[1]}"
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH, patient=True) as channel:
            first, second = (SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(channel)), TEST_LEARNER_SECRET) for _ in range(2))
            first.take_seat(hung_address, patience_s=0)
            first.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=1))
            with pytest.raises(grpc.RpcError) as refused:
                second.take_seat("127.0.0.1:2", patience_s=0)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert refused.value.details().startswith(
                f"address: the controller could not challenge the learner at {hung_address}"), refused.value.details()
            first.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=2))  # still the seat's holder
            silent_from = time.monotonic()
            second.take_seat("127.0.0.1:2", patience_s=30)  # retries until the holder has been silent for 5 s
            assert time.monotonic() - silent_from >= 5.0
            err = rpc_error(first.LearnerHeartbeat, pb.LearnerHeartbeatRequest(step=3))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            second.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=3))
    finally:
        hung.close()
        server.stop(0).wait()
        server.controller_state.close()


# ---- the status page over real HTTP -----------------------------------------------------------------------


def http_get(port: int, path: str) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return answer.headers["content-type"], answer.read().decode()


def test_status_page_over_http(controller):
    rid = register(controller.stub)
    controller.stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4))
    page = StatusPage(controller.state, "127.0.0.1", 0)
    port = page.start()
    try:
        _, body = http_get(port, "/status")
        status = json.loads(body)
        assert status["admitted"] == 4 and status["replicas"][0]["replica_id"] == rid
        content_type, metrics = http_get(port, "/metrics")
        assert content_type.startswith("text/plain")
        assert "asyncrl_controller_admitted_trajectories 4.0" in metrics
        assert "asyncrl_controller_leases_granted_total 1.0" in metrics
        assert rid in http_get(port, "/")[1]
        assert http_get(port, "/healthz")[1] == "ok"
    finally:
        page.stop()


# ---- a real weight push: gloo broadcast to in-process Rollout receivers -----------------------------------


class GlooReceiver(rollout_pb2_grpc.RolloutServicer):
    """A minimal rollout replica: joins the broadcast, keeps the tensors; fails the first `fail_times` pushes
    after receiving (an engine that rejects the weights), so the broadcast itself still completes."""

    def __init__(self, fail_times: int = 0):
        self.fail_times = fail_times
        self.received: dict[int, dict[str, torch.Tensor]] = {}
        self.push_key = b""
        """Its registration's key: it answers the controller's challenges under it."""

    def GetStatus(self, request, context):
        mac = liveness_mac(self.push_key, request.challenge) if self.push_key and request.challenge else b""
        return rollout_pb2.RolloutStatus(challenge_mac=mac)

    def UpdateWeights(self, request, context):
        plan = PushPlan.from_proto(request.plan)
        group = make_group(plan, request.rank)
        got = {}
        try:
            for bucket in receive_weights(group, plan):
                got.update({name: t.clone() for name, t in bucket})
        finally:
            group.close()
        if self.fail_times > 0:
            self.fail_times -= 1
            context.abort(grpc.StatusCode.INTERNAL, "engine rejected the weights")
        self.received[plan.version] = got
        return rollout_pb2.UpdateWeightsResponse(weight_version=plan.version)


@pytest.fixture
def receivers():
    """Start Rollout servers on demand: `start(servicer) -> address`; all stopped at teardown."""
    servers = []

    def start(servicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rollout_pb2_grpc.add_RolloutServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0)


def register_receiver(controller, address: str, servicer: GlooReceiver) -> str:
    """Register the receiver at `address` and wait until the controller has reached it there (it joins
    pushes from then on)."""
    reply = controller.stub.RegisterReplica(pb.RegisterReplicaRequest(address=address, engine="torch"))
    servicer.push_key = reply.push_key
    reachable = lambda: next(r for r in controller.state.snapshot()["replicas"]
                             if r["replica_id"] == reply.replica_id)["reachable"]
    deadline = time.monotonic() + 10
    while not reachable():
        assert time.monotonic() < deadline, "the controller never reached the receiver"
        time.sleep(0.02)
    return reply.replica_id


def named_weights(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [("layer.weight", torch.randn(16, 8, generator=g)), ("layer.bias", torch.randn(16, generator=g)),
            ("steps", torch.arange(3) + version)]  # fmt: skip


def push_as_learner(stub, store, version: int):
    """Rank 0: Begin, broadcast over gloo, Commit. Returns (begin response, commit response)."""
    named = named_weights(version)
    specs = [weights_pb2.TensorSpec(name=n, shape=list(t.shape), dtype=str(t.dtype)[6:]) for n, t in named]
    begun = stub.BeginWeightPush(
        pb.BeginWeightPushRequest(version=version, store_address=f"127.0.0.1:{store.port}", store_key=store.key, transport="gloo",
                                  tensors=specs, bucket_bytes=512, timeout_s=20)
    )  # fmt: skip
    plan = PushPlan.from_proto(begun.plan)
    group = make_group(plan, 0, store)
    try:
        send_weights(group, named, plan)
    finally:
        group.close()
    return begun, stub.CommitWeightPush(pb.CommitWeightPushRequest(push_id=plan.push_id, sender_ok=True))


def test_held_acquire_is_released_by_a_commit_over_grpc(controller, receivers):
    """A lease request held for want of quota (η = 0, version 0's batch leased) is answered by the commit
    of version 1, which the requesting replica acknowledged (a replica earns its leases by taking a push)."""
    stub = controller.stub
    servicer = GlooReceiver()
    rid = register_receiver(controller, receivers(servicer), servicer)
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=8)).granted
    answer = {}
    held = threading.Thread(
        target=lambda: answer.update(
            r=stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=10))
        )
    )
    held.start()
    deadline = time.monotonic() + 5
    while stub.GetStatus(pb.GetStatusRequest()).held_requests == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _, commit = push_as_learner(stub, host_store("127.0.0.1", 0, 30), version=1)
    assert commit.committed and list(commit.acked) == [rid]
    held.join(timeout=10)
    assert answer["r"].granted and answer["r"].version == 1


def test_a_fresh_runs_replica_earns_its_leases_with_the_push_of_version_0(tmp_path, receivers):
    """By default nothing a replica claims is believed, version 0 included: a fresh run's replica registers
    needing a sync and gets no lease until it acknowledged the learner's push of version 0."""
    server, port = create_server(make_config(trust_initial_weights=False), run_dir=str(tmp_path))
    server.start()
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as channel:
            stub = SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(channel)),
                                    TEST_LEARNER_SECRET)
            stub.take_seat("127.0.0.1:1", patience_s=0)
            controller = Controller(stub, channel, server.controller_state, f"127.0.0.1:{port}", tmp_path)
            servicer = GlooReceiver()
            rid = register_receiver(controller, receivers(servicer), servicer)
            refused = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
            assert not refused.granted and "needs a weight sync to version 0" in refused.reason
            assert stub.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=0, version=0)).sync_requested
            _, commit = push_as_learner(stub, host_store("127.0.0.1", 0, 30), version=0)
            assert commit.committed and list(commit.acked) == [rid] and commit.current_version == 0
            assert servicer.received[0]["steps"].tolist() == [0, 1, 2]
            assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0)).granted
    finally:
        server.stop(0).wait()
        server.controller_state.close()


def test_weight_push_reaches_two_receivers_and_commits(controller, receivers):
    first, second = GlooReceiver(), GlooReceiver()
    a = register_receiver(controller, receivers(first), first)
    b = register_receiver(controller, receivers(second), second)
    store = host_store("127.0.0.1", 0, 30)
    begun, commit = push_as_learner(controller.stub, store, version=1)
    assert begun.plan.world_size == 3 and list(begun.receivers) == [a, b]
    assert commit.committed and commit.current_version == 1
    assert list(commit.acked) == [a, b] and list(commit.dropped) == []
    for servicer in (first, second):
        for name, tensor in named_weights(1):
            assert torch.equal(servicer.received[1][name], tensor), name
    status = controller.stub.GetStatus(pb.GetStatusRequest())
    assert status.current_version == 1 and all(
        r.weight_version == 1 and not r.needs_sync for r in status.replicas
    )
    committed = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "push_committed"]
    assert committed[0]["version"] == 1 and committed[0]["acked"] == [a, b]


def test_failed_receiver_is_dropped_then_resynced(controller, receivers):
    stub = controller.stub
    good, flaky = GlooReceiver(), GlooReceiver(fail_times=1)
    a = register_receiver(controller, receivers(good), good)
    b = register_receiver(controller, receivers(flaky), flaky)
    store = host_store("127.0.0.1", 0, 30)
    _, commit = push_as_learner(stub, store, version=1)
    assert commit.committed and commit.current_version == 1
    assert list(commit.acked) == [a] and list(commit.dropped) == [b]
    assert stub.Heartbeat(pb.HeartbeatRequest(replica_id=b, weight_version=0)).needs_sync
    refused = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=b, num_trajectories=4, wait_s=0))
    assert not refused.granted and "needs a weight sync" in refused.reason
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=a, num_trajectories=4, wait_s=0)).granted
    assert stub.LearnerHeartbeat(pb.LearnerHeartbeatRequest(step=1, version=1, consumed=8)).sync_requested
    # The learner answers sync_requested with a resync push of the current version to the lagging replica.
    begun, resync = push_as_learner(stub, store, version=1)
    assert list(begun.receivers) == [b] and begun.plan.world_size == 2
    assert resync.committed and list(resync.acked) == [b] and resync.current_version == 1
    assert torch.equal(flaky.received[1]["layer.bias"], named_weights(1)[1][1])
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=b, num_trajectories=4, wait_s=0)).granted
    dropped = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "replica_dropped"]
    assert dropped[0]["replica_id"] == b and "engine rejected the weights" in dropped[0]["error"]


def test_a_replica_nobody_answers_for_joins_no_push(controller, receivers):
    """A registration's address is a claim: a replica joins pushes only once it answered the controller's
    challenge there. Before, a token holder who registered a fresh unreachable address before every push
    stalled each for join_timeout_s, and three in a row ended the learner."""
    stub, good = controller.stub, GlooReceiver()
    a = register_receiver(controller, receivers(good), good)
    strays = []
    for version in (1, 2, 3):
        strays.append(register(stub, "127.0.0.1:1", version=version - 1))  # nothing listens on port 1
        # A store of its own per push: push_as_learner forms a group per push, not the kept one.
        begun, commit = push_as_learner(stub, host_store("127.0.0.1", 0, 30), version)
        assert list(begun.receivers) == [a] and commit.committed and list(commit.acked) == [a]
    assert all(torch.equal(good.received[3][n], t) for n, t in named_weights(3))
    # After its quick retries a stray is held back like a replica that failed pushes, and told why.
    deadline = time.monotonic() + 10
    while not (pulse := stub.Heartbeat(pb.HeartbeatRequest(replica_id=strays[0], weight_version=0))).held_back_s:
        assert time.monotonic() < deadline, "the stray was never held back"
        time.sleep(0.1)
    assert pulse.push_problem.startswith("unreachable at 127.0.0.1:1: nothing there answered"), pulse.push_problem
    status = {r.replica_id: r for r in stub.GetStatus(pb.GetStatusRequest()).replicas}
    assert status[a].reachable and not any(status[s].reachable for s in strays)
    kinds = [e["kind"] for e in read_events(controller.run_dir, "controller")]
    assert "push_aborted" not in kinds and kinds.count("replica_reachable") == 1


def test_a_receiver_whose_process_is_gone_is_left_out_at_once_not_after_the_join_timeout(controller, receivers):
    """The controller's order cannot reach a receiver whose process died (nothing listens at its address): it
    says so in the learner's store, and the sender calls the push off at once naming that rank, instead of
    waiting out join_timeout_s for it (found by the chaos soak: every replica crash cost the learner ~5 s)."""
    stub, alive = controller.stub, GlooReceiver()
    a = register_receiver(controller, receivers(alive), alive)
    doomed, server = GlooReceiver(), grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rollout_pb2_grpc.add_RolloutServicer_to_server(doomed, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    b = register_receiver(controller, f"127.0.0.1:{port}", doomed)
    server.stop(0).wait()  # the replica's process is gone; its heartbeat is not stale yet
    store = host_store("127.0.0.1", 0, 30)
    named = named_weights(1)
    specs = [weights_pb2.TensorSpec(name=n, shape=list(t.shape), dtype=str(t.dtype)[6:]) for n, t in named]
    begun = stub.BeginWeightPush(pb.BeginWeightPushRequest(
        version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, transport="gloo", tensors=specs, bucket_bytes=512,
        timeout_s=20, join_timeout_s=15))  # fmt: skip
    assert list(begun.receivers) == [a, b]
    t0 = time.monotonic()
    with pytest.raises(ReceiversMissing, match=r"rank \[2\] could not be reached \(nothing listens at their address\)") as missing:
        make_group(PushPlan.from_proto(begun.plan), 0, store)
    assert time.monotonic() - t0 < 5, "the sender waited for the dead receiver"
    failed = stub.CommitWeightPush(pb.CommitWeightPushRequest(
        push_id=begun.plan.push_id, sender_ok=False, error=str(missing.value), missing_ranks=missing.value.ranks))
    assert not failed.committed
    # The retry goes without it and commits.
    begun, commit = push_as_learner(stub, store, version=1)
    assert list(begun.receivers) == [a] and commit.committed and list(commit.acked) == [a]
    assert torch.equal(alive.received[1]["layer.weight"], named[0][1])


def test_a_lease_holder_whose_process_is_gone_returns_its_quota_before_its_heartbeat_time_out(controller, receivers):
    """η = 0: the batch's quota is leased to a replica whose process then dies. The other replica's request
    waits for that quota; the controller dials the silent holder's address, the connection is refused, and the
    lease expires ("gone") well before heartbeat_timeout_s (10 s), which used to be the wait (or the dead
    replica's restart)."""
    stub = controller.stub
    doomed, server = GlooReceiver(), grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rollout_pb2_grpc.add_RolloutServicer_to_server(doomed, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    holder = register_receiver(controller, f"127.0.0.1:{port}", doomed)
    other = GlooReceiver()
    waiting = register_receiver(controller, receivers(other), other)
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=holder, num_trajectories=8)).granted
    server.stop(0).wait()  # the holder's process is gone: nothing listens at its address
    t0 = time.monotonic()
    answer = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=waiting, num_trajectories=8, wait_s=9))
    assert answer.granted, "the quota never came back"
    assert time.monotonic() - t0 < 6
    dead = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "replica_dead"]
    assert [(e["replica_id"], e["reason"], e["leases_expired"]) for e in dead] == [(holder, "gone", 1)]


def test_a_learner_store_the_controller_cannot_reach_costs_the_report_at_most_two_seconds(caplog):
    """Reporting a gone receiver is best effort: a learner store the controller cannot reach (nothing listens
    there) must not hold that receiver's outcome, and the commit waiting for it, for the push's time-out."""
    plan = PushPlan(push_id="p-unreachable-store", version=1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=(), bucket_bytes=1 << 20, timeout_s=60.0)
    importlib.import_module(STORE_CLIENT_MODULE)  # as a controller does once it is up (preload_store_client)
    with socket.socket() as sock:  # a port nothing listens on: the receiver's process is gone
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    t0 = time.monotonic()
    with pytest.raises(ReceiverUnreachable):
        ReplicaChannels(TEST_AUTH).update_weights(dead, plan, 2, 60.0, b"")
    assert time.monotonic() - t0 < TELL_SENDER_TIMEOUT_S + 3
    assert "could not tell the sender that rank 2 is gone" in caplog.text


def test_a_replica_that_heartbeats_but_never_completes_its_leases_loses_them_at_lease_max_s(tmp_path):
    """Quota hoarding over the wire: a client with the run's token takes the whole batch at η = 0 and keeps
    heartbeating with its leases listed. Another replica's held request is granted once the leases reach
    `controller.lease_max_s`, and the hoarder's late completion is refused naming the lease."""
    # The replicas' own deadline no longer than the controller's limit, as loading a config asks.
    server, port = create_server(make_config(lease_max_s=1.0, rollout={"lease_deadline_s": 1.0}), run_dir=str(tmp_path))
    server.start()
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as channel:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(channel))
            hoarder, other = register(stub, "127.0.0.1:9"), register(stub, "127.0.0.1:10")
            taken = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=hoarder, num_trajectories=4, max_leases=2))
            assert len(taken.leases) == 2  # B = 8 at η = 0: all the quota there is
            held = pb.HeldLeases(lease_ids=[lease.lease_id for lease in taken.leases])
            stop = threading.Event()

            def heartbeat():
                while not stop.wait(0.1):
                    stub.Heartbeat(pb.HeartbeatRequest(replica_id=hoarder, held_leases=held))
                    stub.Heartbeat(pb.HeartbeatRequest(replica_id=other))

            beating = threading.Thread(target=heartbeat, daemon=True)
            beating.start()
            t0 = time.monotonic()
            granted = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=other, num_trajectories=4, wait_s=4.0))
            waited = time.monotonic() - t0
            stop.set()
            beating.join()
            assert granted.granted and 0.5 < waited < 3.0, (granted, waited)
            err = rpc_error(stub.CompleteLease, pb.CompleteLeaseRequest(
                replica_id=hoarder, lease_id=taken.leases[0].lease_id, num_written=4))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert err.details().startswith(f"lease_id: lease {taken.leases[0].lease_id!r} is expired: max_age")
        expired = [e for e in read_events(tmp_path, "controller") if e["kind"] == "lease_expired"]
        assert sorted((e["lease_id"], e["reason"]) for e in expired) == sorted(
            (lease.lease_id, "max_age") for lease in taken.leases)
    finally:
        server.stop(0).wait()
        server.controller_state.close()


def hold_one(stub, rid: str, wait_s: float = 30.0):
    """A lease request the controller holds (η = 0 and the version's batch already leased): its future."""
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=8)).granted
    call = stub.AcquireLeases.future(
        pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=1, wait_s=wait_s), timeout=60
    )
    deadline = time.monotonic() + 5
    while stub.GetStatus(pb.GetStatusRequest()).held_requests == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return call


def test_a_stopping_controller_answers_held_lease_requests_at_once(tmp_path):
    """A held request would otherwise keep the server's grace period (and its replica) for up to max_hold_s."""
    server, port = create_server(make_config(max_hold_s=30.0), run_dir=str(tmp_path))
    server.start()
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as channel:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(channel))
            rid = register(stub)
            call = hold_one(stub, rid)
            started = time.monotonic()
            server.release_held()
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "stopping" in info.value.details()
            assert time.monotonic() - started < 2
            with pytest.raises(grpc.RpcError) as info:  # a new request is not held either
                stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=1,
                                                           wait_s=30), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.stop(5).wait(2)
    finally:
        server.stop(0).wait()
        server.controller_state.close()


def test_a_stopping_replica_cancels_its_held_lease_request(controller):
    from asyncrl.rollout.worker import answer_unless_stopped

    stub = controller.stub
    rid = register(stub)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert answer_unless_stopped(stop, hold_one(stub, rid)) is None
    assert time.monotonic() - started < 3
    deadline = time.monotonic() + 5
    while stub.GetStatus(pb.GetStatusRequest()).held_requests:  # the controller let it go
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Not stopping: the answer itself (none granted within wait_s).
    answer = answer_unless_stopped(threading.Event(), stub.AcquireLeases.future(
        pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=1, wait_s=0.1), timeout=10))
    assert list(answer.leases) == [] and answer.reason


# ---- serve() as a process ---------------------------------------------------------------------------------


def test_serve_prints_ports_and_stops_on_sigterm(tmp_path):
    config = make_config().model_copy(update={"run_dir": str(tmp_path)})
    dump_config(config, tmp_path / "config.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.tools.cli", "controller", "--config", str(tmp_path / "config.yaml")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "asyncrl-controller listening" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stdout.readline()
        match = re.search(r"grpc=([\w.]+):(\d+) http=([\w.]+):(\d+)", line)
        assert match, line
        grpc_port, http_port = int(match.group(2)), int(match.group(4))
        assert http_get(http_port, "/healthz")[1] == "ok"
        with grpc_channel(f"127.0.0.1:{grpc_port}", TEST_AUTH) as channel:
            status = controller_pb2_grpc.ControllerStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)
        assert status.batch_size == 8
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert read_events(tmp_path, "controller")[0]["kind"] == "controller_started"


def test_the_learner_returns_a_dropped_groups_quota_once_and_its_fields_are_checked(controller):
    """`ReturnQuota` (the learner's, with its key): N_r goes down by the trajectories once per entry; a bad field
    is INVALID_ARGUMENT naming it and changes nothing."""
    stub = controller.stub
    rid = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:7001", engine="torch")).replica_id
    granted = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4))
    assert granted.granted
    for request, field in [(pb.ReturnQuotaRequest(entry_id="", trajectories=1), "entry_id"),
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=0), "trajectories"),
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=10**6), "trajectories"),
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=1, reason="x" * 10**5), "reason"),
                           # Only a prompt the stream handed out can be generated again (prompt 0 so far).
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=1, prompt_index=1), "prompt_index"),
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=1, prompt_index=-1), "prompt_index"),
                           (pb.ReturnQuotaRequest(entry_id="1-0", trajectories=1, lease_id="a b"), "lease_id")]:
        err = rpc_error(stub.ReturnQuota, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(field), err.details()
    assert controller.state.admitted == 4
    reply = stub.ReturnQuota(pb.ReturnQuotaRequest(entry_id="1-0", trajectories=4, reason="staleness",
                                                   prompt_index=0, lease_id=granted.lease_id))
    assert (reply.returned, reply.admitted) == (4, 0)
    again = stub.ReturnQuota(pb.ReturnQuotaRequest(entry_id="1-0", trajectories=4, reason="staleness",
                                                   prompt_index=0))
    assert (again.returned, again.admitted) == (0, 0)
    # The prompt is generated again, once: the next lease samples it, the one after moves the stream on.
    stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=granted.lease_id, num_written=4))
    regenerated = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=2))
    assert regenerated.HasField("sample_index") and regenerated.sample_index == 0 and regenerated.prompt_index == 1
    moved_on = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=2))
    assert not moved_on.HasField("sample_index") and moved_on.prompt_index == 2


def test_await_leases_holds_the_learner_until_the_old_leases_have_ended(controller, monkeypatch):
    """`AwaitLeases` (`learner.stale_groups: hold`): held while a lease granted at the version or below is
    active, answered as soon as its completion arrives (not at a poll); answered with what is outstanding when
    wait_s is up; a version beyond the one a push in flight would commit is INVALID_ARGUMENT naming it."""
    # A poll far longer than the wait below, so an answer in time can only come from the lease's end (a
    # threshold under the usual 0.25 s poll failed on a loaded CI machine by latency alone).
    monkeypatch.setattr(held_request, "HOLD_POLL_S", 60.0)
    stub = controller.stub
    rid = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:7001", engine="torch")).replica_id
    lease = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4))
    short = stub.AwaitLeases(pb.AwaitLeasesRequest(version=0, wait_s=0.2))
    assert (short.outstanding, short.oldest_version) == (1, 0)
    # The learner at version 1 with η = 0, its push of 1 not yet committed, asks for version 1.
    assert stub.AwaitLeases(pb.AwaitLeasesRequest(version=1, wait_s=0.0)).outstanding == 1
    for request, field in [(pb.AwaitLeasesRequest(version=2), "version"),
                           (pb.AwaitLeasesRequest(version=-1), "version"),
                           (pb.AwaitLeasesRequest(version=0, wait_s=-1.0), "wait_s")]:
        err = rpc_error(stub.AwaitLeases, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(field), err.details()
    with futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(stub.AwaitLeases, pb.AwaitLeasesRequest(version=0, wait_s=20.0))
        time.sleep(0.5)
        assert not held.done()
        completed_at = time.monotonic()
        stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=lease.lease_id, num_written=4))
        assert held.result(timeout=10).outstanding == 0
        assert time.monotonic() - completed_at < 5.0  # woken by the lease's end: the poll is 60 s, wait_s 20 s


def test_a_forged_groups_prompt_or_lease_never_stops_the_learners_quota_return(controller):
    """The prompt and lease id the learner sends come from a group a replica wrote: a prompt the stream never
    handed out or a lease id the controller refuses (a token holder's forged group) costs the regeneration,
    not the learner: the quota still comes back, and nothing is queued."""
    from asyncrl.learner.quota_return import return_quota

    stub = controller.stub
    rid = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:7001", engine="torch")).replica_id
    assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4)).granted
    return_quota(stub, "1-0", 4, "staleness: ...", prompt=10**9, lease_id="replica-0/lease-x")
    assert controller.state.admitted == 0 and controller.state.snapshot()["prompts_to_regenerate"] == 0
    (record,) = [e for e in read_events(controller.run_dir, "controller") if e["kind"] == "quota_returned"]
    assert record["prompt_index"] is None and record["returned"] == 4


def test_a_token_holder_cannot_speak_for_another_replicas_id(controller):
    """Heartbeats, lease requests and completions name a replica id; without the proof of that registration
    (`replica_proof` under its push key) they are PERMISSION_DENIED and change nothing. Before, a forged
    heartbeat at version 2^53 marked a live victim as needing a sync (33 withdrawn pushes when sent fast), and a
    forged completion could complete the victim's leases."""
    victim = controller.stub  # the replica's own calls carry its proof (RegisteredReplica)
    rid = register(victim)
    lease = victim.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
    assert lease.granted
    raw = controller_pb2_grpc.ControllerStub(controller.channel)  # the token, not the registration
    # Another registration's (the attacker's own) is no proof for this id either.
    other = raw.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:8", engine="torch"))
    wrong = (b"", replica_call_mac(b"", rid), replica_call_mac(other.push_key, rid), other.push_key,
             replica_call_mac(other.push_key, other.replica_id))
    forged = [
        ("Heartbeat", pb.HeartbeatRequest(replica_id=rid, weight_version=2**53)),
        ("AcquireLease", pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4)),
        ("AcquireLeases", pb.AcquireLeasesRequest(replica_id=rid, num_trajectories=4, max_leases=1)),
        ("CompleteLease", pb.CompleteLeaseRequest(replica_id=rid, lease_id=lease.lease_id, num_written=4)),
        ("CompleteLeases", pb.CompleteLeasesRequest(replica_id=rid, completions=[
            pb.LeaseCompletion(lease_id=lease.lease_id, num_written=4)])),
    ]
    for method, request in forged:
        for proof in wrong:
            request.replica_proof = proof
            err = rpc_error(getattr(raw, method), request)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "replica_proof" in err.details(), method
    status = victim.GetStatus(pb.GetStatusRequest())
    mine = next(r for r in status.replicas if r.replica_id == rid)
    assert mine.weight_version == 0 and mine.active_leases == 1 and status.admitted == 4
    reply = victim.Heartbeat(pb.HeartbeatRequest(replica_id=rid, weight_version=0))
    assert not reply.needs_sync


def test_registrations_are_capped_per_calling_host_not_per_named_address(tmp_path):
    """The cap counts where the call came from: registrations naming three different hosts, all sent from
    this one, stop at max_replicas_per_host with RESOURCE_EXHAUSTED naming the caller's host."""
    server, port = create_server(make_config(max_replicas_per_host=2), run_dir=str(tmp_path))
    server.start()
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as channel:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(channel))
            register(stub, "10.0.0.1:7000")
            register(stub, "10.0.0.2:7000")
            err = rpc_error(stub.RegisterReplica, pb.RegisterReplicaRequest(address="10.0.0.3:7000", engine="torch"))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "from 127.0.0.1" in err.details() and "max_replicas_per_host" in err.details()
    finally:
        server.stop(0).wait()
        server.controller_state.close()
