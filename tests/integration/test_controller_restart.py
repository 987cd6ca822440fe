"""The controller keeps its state in Redis: a controller started again (same port, same Redis) continues with
the version, N_r, the prompt cursor, the replicas and their leases; clients on patient channels ride the gap."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import redis

from asyncrl.controller.persistence import StateOfAnotherRun
from asyncrl.core.buffer.redis_buffer import RedisBuffer
from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.learner.seat import SeatedController
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.services.controller_service import create_server
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, trajectory_pb2, weights_pb2
from tests.conftest import TEST_AUTH, TEST_LEARNER_SECRET, TEST_STORE_KEY
from tests.integration.test_controller_service import make_config


def redis_config(redis_url, run_dir, port=0):
    config = make_config(state_store="redis", eta=1, port=port)
    config.buffer.redis_url = redis_url
    config.run_dir = str(run_dir)
    return config


def write_group(redis_url, lease_id: str, n: int = 4) -> None:
    """What a replica does before completing a lease as written: its group into the buffer (counted under the
    lease, `asyncrl.core.buffer.lease_writes`)."""
    buffer = RedisBuffer(redis.Redis.from_url(redis_url), "asyncrl:trajectories", "learner", "test")
    group_id = f"replica-{lease_id}"
    buffer.put(trajectory_pb2.TrajectoryGroup(group_id=group_id, lease_id=lease_id, trajectories=[
        trajectory_pb2.Trajectory(trajectory_id=f"{group_id}/{j}", group_id=group_id) for j in range(n)]))


def start(config):
    server, port = create_server(config)
    server.start()
    return server, port


def stop(server):
    server.stop(0).wait()
    server.controller_state.close()


def test_restarted_controller_continues_and_patient_clients_wait_for_it(clean_redis, tmp_path):
    server, port = start(redis_config(clean_redis, tmp_path))
    ch = grpc_channel(f"127.0.0.1:{port}", TEST_AUTH, patient=True)
    stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
    rid = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:9", engine="torch")).replica_id
    leases = [stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
              for _ in range(3)]
    assert all(x.granted for x in leases)
    write_group(clean_redis, leases[0].lease_id)
    stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=leases[0].lease_id, num_written=4))
    before = stub.GetStatus(pb.GetStatusRequest())
    stop(server)  # what it told its clients is in Redis already; nothing is flushed on the way out

    # A call made while no controller listens waits for the next one (within its deadline).
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(stub.Heartbeat(
        pb.HeartbeatRequest(replica_id=rid, weight_version=0,
                            held_leases=pb.HeldLeases(lease_ids=[x.lease_id for x in leases[1:]])), timeout=30)))
    waiting.start()
    time.sleep(1.5)
    assert waiting.is_alive()
    again, port_again = start(redis_config(clean_redis, tmp_path, port=port))
    try:
        assert port_again == port
        waiting.join(30)
        assert answers and answers[0].current_version == 0 and not answers[0].needs_sync
        after = stub.GetStatus(pb.GetStatusRequest())
        assert (after.current_version, after.admitted) == (before.current_version, before.admitted) == (0, 12)
        assert [r.replica_id for r in after.replicas] == [rid] and after.replicas[0].active_leases == 2
        # The leases granted before the restart complete normally; η still counts them: (0 + 1 + 1) * 8 = 16.
        write_group(clean_redis, leases[1].lease_id)
        stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=leases[1].lease_id, num_written=4))
        assert stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0)).granted
        refused = stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4, wait_s=0))
        assert not refused.granted and "staleness bound" in refused.reason
        restored = again.controller_state.restored
        assert restored == {"version": 0, "admitted": 12, "next_prompt_index": 3, "leases": 2, "replicas": 1}
    finally:
        ch.close()
        stop(again)


def begin_request():
    return pb.BeginWeightPushRequest(version=1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, transport="gloo", bucket_bytes=1024,
                                     timeout_s=5, tensors=[weights_pb2.TensorSpec(name="w", shape=[2, 2],
                                                                                  dtype="float32")])


def test_a_push_open_when_the_controller_died_is_refused_at_commit(clean_redis, tmp_path):
    server, port = start(redis_config(clean_redis, tmp_path))
    with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH, patient=True) as ch:
        stub = SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(ch)), TEST_LEARNER_SECRET)
        stub.take_seat("127.0.0.1:1", patience_s=0)
        begun = stub.BeginWeightPush(begin_request())
        stop(server)
        again, _ = start(redis_config(clean_redis, tmp_path, port=port))
        try:
            with pytest.raises(grpc.RpcError) as info:
                stub.CommitWeightPush(pb.CommitWeightPushRequest(push_id=begun.plan.push_id, sender_ok=True))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no push is open" in info.value.details()
            # The learner begins it again and commits (the restarted controller still knows its seat).
            retry = stub.BeginWeightPush(begin_request())
            done = stub.CommitWeightPush(pb.CommitWeightPushRequest(push_id=retry.plan.push_id, sender_ok=True))
            assert done.committed and done.current_version == 1
        finally:
            stop(again)
    third, _ = start(redis_config(clean_redis, tmp_path, port=port))
    try:
        assert third.controller_state.current_version == 1
    finally:
        stop(third)


def test_a_controller_of_another_run_refuses_the_saved_state(clean_redis, tmp_path):
    server, _ = start(redis_config(clean_redis, tmp_path / "a"))
    stop(server)
    with pytest.raises(StateOfAnotherRun, match="controller.state_key"):
        create_server(redis_config(clean_redis, tmp_path / "b"))


def test_a_lease_completed_as_written_counts_only_what_reached_the_buffer(clean_redis, tmp_path):
    """A token holder takes all of η = 1's quota and completes every lease as written without writing: the
    controller reads the buffer's counters, the quota returns and leases are granted again (before, 24 such
    calls stalled a run for good). A lease whose group did reach the buffer counts as written."""
    server, port = start(redis_config(clean_redis, tmp_path))
    try:
        with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
            rid = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:9", engine="torch")).replica_id

            def take_all():
                leases = []
                while (lease := stub.AcquireLease(pb.AcquireLeaseRequest(replica_id=rid, num_trajectories=4,
                                                                          wait_s=0))).granted:
                    leases.append(lease)
                return leases

            stolen = take_all()
            assert len(stolen) == 4  # (0 + 1 + 1) * 8 / 4
            stub.CompleteLeases(pb.CompleteLeasesRequest(replica_id=rid, completions=[
                pb.LeaseCompletion(lease_id=lease.lease_id, num_written=4) for lease in stolen]))
            assert stub.GetStatus(pb.GetStatusRequest()).admitted == 0  # every claim was empty: all returned
            honest = take_all()
            assert len(honest) == 4  # admission went on
            write_group(clean_redis, honest[0].lease_id)
            stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=honest[0].lease_id, num_written=4))
            assert stub.GetStatus(pb.GetStatusRequest()).admitted == 16  # its 4 stay counted
    finally:
        stop(server)
    completed = [e for e in read_events(tmp_path, "controller") if e["kind"] == "lease_completed"]
    assert [(e["num_written"], e.get("claimed")) for e in completed] == [(0, 4)] * 4 + [(4, None)]


def redis_dump(redis_url) -> bytes:
    """Every value in the Redis (as its admin reads it), concatenated."""
    client = redis.Redis.from_url(redis_url)
    out = []
    for key in client.scan_iter():
        kind = client.type(key).decode()
        if kind == "hash":
            out += [b"%s=%s" % kv for kv in client.hgetall(key).items()]
        elif kind == "string":
            out.append(client.get(key))
        elif kind == "stream":
            out += [repr(entry).encode() for entry in client.xrange(key)]
        else:
            out.append(repr(client.dump(key)).encode())
    return b"\n".join(out)


def test_the_saved_state_holds_no_key_that_signs_and_another_secret_opens_none(clean_redis, tmp_path):
    """The learner's key and a replica's push key are in the controller's Redis state only sealed under the
    learner secret (`controller/key_seal.py`): the whole Redis content holds neither, a controller restarted
    with the same secret still knows both, and one restarted under another secret knows neither (the replica
    registers again, the learner takes the seat again)."""
    server, port = start(redis_config(clean_redis, tmp_path))
    with grpc_channel(f"127.0.0.1:{port}", TEST_AUTH, patient=True) as ch:
        stub = SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(ch)), TEST_LEARNER_SECRET)
        stub.take_seat("127.0.0.1:1", patience_s=0)
        registered = stub.RegisterReplica(pb.RegisterReplicaRequest(address="127.0.0.1:9", engine="torch"))
        rid = registered.replica_id
        dump = redis_dump(clean_redis)
        assert f"{rid}".encode() in dump and b"sealed1:" in dump
        for key in (stub.key, registered.push_key):
            assert len(key) >= 16 and key not in dump and key.hex().encode() not in dump
        stop(server)

        again, _ = start(redis_config(clean_redis, tmp_path, port=port))
        try:
            assert stub.Heartbeat(pb.HeartbeatRequest(replica_id=rid, weight_version=0)).current_version == 0
            assert stub.BeginWeightPush(begin_request()).plan.push_id
        finally:
            stop(again)

        other = redis_config(clean_redis, tmp_path, port=port)
        (tmp_path / "other-secret").write_text("another learner secret\n")
        other.security.learner_secret_file = str(tmp_path / "other-secret")
        third, _ = start(other)
        try:
            with pytest.raises(grpc.RpcError) as unknown:
                stub.Heartbeat(pb.HeartbeatRequest(replica_id=rid, weight_version=0))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND, unknown.value.details()
            with pytest.raises(grpc.RpcError) as unseated:
                stub.BeginWeightPush(begin_request())
            assert unseated.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no learner holds this run's seat" in unseated.value.details()
        finally:
            stop(third)
