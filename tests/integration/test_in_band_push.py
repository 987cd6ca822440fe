"""In-band pushes over real gRPC, gloo and the learner's TCPStore: what a replica that follows its group does
with an order nobody signed, how the run goes on when a follower stops listening, and the push each commit
reserves."""

from __future__ import annotations

import contextlib

import pytest

from asyncrl.core.model.modeling import load_causal_lm
from asyncrl.core.runtime.events import read_events
from asyncrl.push.in_band import WAKE, publish_order
from asyncrl.push.plan import PushPlan
from asyncrl.push.sender import WeightPublisher
from asyncrl.v1 import controller_pb2
from tests.integration.test_background_push import push_system
from tests.run_helpers import wait_for

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def publishing(config, stub, model):
    """The learner's side of the pushes, from `model`, closed on exit."""
    publisher = WeightPublisher(stub, model, config.learner.weight_transport, config.controller.push_timeout_s)
    try:
        yield publisher
    finally:
        publisher.close()


def refused(replica) -> float:
    return replica.servicer.metrics.pushes_refused._value.get()


def test_an_order_nobody_signed_is_refused_and_the_real_one_still_gets_through(tiny_model_dir, tmp_path):
    with (push_system(tiny_model_dir, tmp_path, in_band=True) as (config, stub, engines, replicas, _),
          publishing(config, stub, load_causal_lm(tiny_model_dir.policy)) as publisher):
        assert publisher.push(1).committed
        listener = replicas[0].servicer.receiver.listener
        followed = listener.followed
        assert followed is not None and followed.rank == 1
        # A member of the push (it holds the store's key) can write there; only the controller can sign.
        address, key = followed.store
        forged = PushPlan(push_id="push-v2-forged", version=2, store_address=address, store_key=key, world_size=3,
                          transport="gloo", tensors=(), bucket_bytes=1 << 20, timeout_s=30.0,
                          group_id=followed.group_id, new_group=False, manifest_digest=publisher.manifest_digest)
        publish_order(publisher.store, followed.group_id, followed.after_push_id, forged, [b"x" * 32, b"y" * 32])
        wait_for(lambda: refused(replicas[0]) == refused(replicas[1]) == 1, 10, "the forged order refused")
        assert listener.followed == followed and all(e.weight_version == 1 for e in engines)

        # Both followers still wait there: the learner's own order replaces the forged one and goes in-band.
        second = publisher.push(2)
        assert second.committed and second.attempts == 1 and second.in_band and len(second.acked) == 2
        assert all(e.weight_version == 2 for e in engines)
        assert refused(replicas[0]) == refused(replicas[1]) == 1


def test_followers_take_in_band_pushes_and_a_new_group_moves_them_on(tiny_model_dir, tmp_path):
    with push_system(tiny_model_dir, tmp_path, in_band=True) as (config, stub, engines, replicas, _):
        learner = load_causal_lm(tiny_model_dir.policy)
        with publishing(config, stub, learner) as publisher:
            results = [publisher.push(v) for v in (1, 2, 3)]
            assert [(r.new_group, r.in_band) for r in results] == [(True, False), (False, True), (False, True)]
            assert [r.servicer.receiver.listener.taken for r in replicas] == [2, 2]
            assert all(e.weight_version == 3 for e in engines)
            group = replicas[0].servicer.receiver.listener.followed.group_id

        # A learner that restarts has a new store: the controller forms a new group there (UpdateWeights), and
        # the followers move on to it.
        with publishing(config, stub, learner) as publisher:
            fourth, fifth = publisher.push(4), publisher.push(5)
            assert fourth.new_group and not fourth.in_band and fifth.in_band and fifth.committed
            assert all(r.servicer.receiver.listener.followed.group_id != group for r in replicas)
            assert all(e.weight_version == 5 for e in engines)


def test_a_follower_whose_process_is_gone_calls_the_push_off_at_once_not_after_the_join_time_out(
        tiny_model_dir, tmp_path):
    """No UpdateWeights call fails for an in-band receiver that is gone: the learner dials the ones that do not
    join and calls the push off as soon as nothing listens there (join_timeout_s is 30 s here)."""
    with (push_system(tiny_model_dir, tmp_path, in_band=True, join_timeout_s=30.0) as (config, stub, engines,
                                                                                      replicas, _),
          publishing(config, stub, load_causal_lm(tiny_model_dir.policy)) as publisher):
        assert publisher.push(1).committed
        # Replica 0's process "dies": nothing listens at its address, and it no longer follows its group.
        replicas[0].servicer.receiver.listener.close()
        replicas[0].stop(0).wait()
        second = publisher.push(2)
        assert second.committed and second.attempts == 2 and second.receivers == 1
        assert second.total_s < 10, second  # the join time-out alone would be 30 s
        print(f"push after a follower died: {second.total_s:.2f} s")
        assert engines[1].weight_version == 2


def test_reserved_pushes_take_no_begin_and_a_resync_drops_the_reservation_quietly(tiny_model_dir, tmp_path):
    """Each commit reserves the next in-band push (`CommitWeightPush.reserve_next`): the learner orders it
    without a BeginWeightPush. A push of another version (a resync) names the reservation unused: nobody is
    flagged for a resync by it, and the group goes on."""
    with (push_system(tiny_model_dir, tmp_path, in_band=True) as (config, stub, engines, replicas, _),
          publishing(config, stub, load_causal_lm(tiny_model_dir.policy)) as publisher):
        results = [publisher.push(v) for v in (1, 2, 3)]
        assert [r.in_band for r in results] == [False, True, True]
        assert all(r.begin_s < 0.001 for r in results[1:]), [r.begin_s for r in results]
        resync = publisher.push(3)  # asked for one, say, and nobody lacks version 3 by now
        assert resync.committed and resync.receivers == 0 and not resync.in_band
        fourth = publisher.push(4)
        assert fourth.in_band and not fourth.new_group and len(fourth.acked) == 2
        assert all(e.weight_version == 4 for e in engines)
        assert [r.servicer.receiver.listener.taken for r in replicas] == [3, 3]
        events = read_events(str(tmp_path), "controller")
        kinds = [e["kind"] for e in events]
        assert kinds.count("push_withdrawn") == 1 and "push_aborted" not in kinds
        begun = [(e["version"], e["reserved"]) for e in events if e["kind"] == "push_begun"]
        assert begun == [(1, False), (2, True), (3, True), (4, True), (3, False), (4, True), (5, True)]
        # Between pushes, an outside client sees the reservation and no open push (GetStatus, as built from
        # proto/ alone).
        status = stub.GetStatus(controller_pb2.GetStatusRequest())
        assert not status.HasField("open_push") and status.HasField("reserved_push")
        reserved = status.reserved_push
        assert (reserved.version, reserved.mode, reserved.in_band) == (5, "new", True)
        assert sorted(reserved.receivers) == sorted(r.replica_id for r in status.replicas) and reserved.push_id


def test_the_keys_a_controller_ordered_push_left_behind_are_deleted_at_the_next_commit(tiny_model_dir, tmp_path):
    """A push the controller orders moves the followers on from the key they waited at: each wakes its wait
    there (`in_band.WAKE`), and no order will ever reach that key; nobody reads the last in-band order again
    either. The learner deletes both at the next commit, so its store does not keep keys per such push for
    the rest of the run."""
    with (push_system(tiny_model_dir, tmp_path, in_band=True) as (config, stub, engines, replicas, _),
          publishing(config, stub, load_causal_lm(tiny_model_dir.policy)) as publisher):
        assert publisher.push(1).new_group
        ordered_at = replicas[0].servicer.receiver.listener.followed.key  # where push 2's order goes
        assert publisher.push(2).in_band and publisher.store.check([ordered_at])
        listener = replicas[0].servicer.receiver.listener
        # The replica follows push 2 once it has acked it: the commit can come first.
        wait_for(lambda: listener.followed.key != ordered_at, 5, "the follower on the key after push 2")
        waited_at = listener.followed.key
        config.learner.weight_transport.in_band = False  # the next pushes through the controller (UpdateWeights)
        third = publisher.push(3)
        assert third.committed and not third.in_band and not third.new_group and len(third.acked) == 2
        wait_for(lambda: publisher.store.check([waited_at]), 5, "the followers' wake at the key they left")
        assert publisher.store.get(waited_at) == WAKE
        fourth = publisher.push(4)
        assert fourth.committed and not fourth.in_band and all(e.weight_version == 4 for e in engines)
        assert not publisher.store.check([waited_at]) and not publisher.store.check([ordered_at])
        config.learner.weight_transport.in_band = True
        fifth = publisher.push(5)  # a Begin: ordered by the controller, on the kept group
        assert not fifth.in_band and not fifth.new_group
        assert publisher.push(6).in_band  # reserved at the commit of 5: the group goes on in-band
