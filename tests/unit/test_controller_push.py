"""ControllerState weight pushes: receiver selection, ranks, commit, drops, resync, aborts, versions."""

import threading

import pytest

from asyncrl.push.plan import PushOffer
from asyncrl.push.protocol import Phase, PushRefused
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, acquire, begin, make_state


def register(state, port, version=0):
    return state.register(f"127.0.0.1:{port}", "", version, "torch").replica_id


def test_zero_receivers_commits_immediately_with_world_size_1():
    state, _, notifier, events = make_state()
    session = begin(state, 1)
    assert session.plan.world_size == 1 and session.receivers == []
    result = state.commit_push(session.push_id, sender_ok=True)
    assert result.committed and result.current_version == 1 and state.current_version == 1
    assert notifier.calls == []
    assert events.of_kind("push_committed")[0]["version"] == 1


def test_new_version_goes_to_every_live_replica_in_rank_order():
    state, clock, notifier, events = make_state(heartbeat_timeout_s=3.0)
    a, _silent, c = (register(state, p) for p in (7001, 7002, 7003))
    clock.advance(2.0)
    state.heartbeat(a, 0)
    state.heartbeat(c, 0)
    clock.advance(2.0)  # b silent for 4 s: dead
    session = begin(state, 1)
    assert [(r.replica_id, r.rank) for r in session.receivers] == [(a, 1), (c, 2)]
    assert session.plan.world_size == 3
    result = state.commit_push(session.push_id, sender_ok=True)
    assert result.acked == [a, c] and result.dropped == []
    assert sorted((addr, rank, world) for addr, _, _, rank, world in notifier.calls) == [
        ("127.0.0.1:7001", 1, 3),
        ("127.0.0.1:7003", 2, 3),
    ]
    begun = events.of_kind("push_begun")[0]
    assert begun["mode"] == "new" and begun["receivers"] == [a, c] and begun["world_size"] == 3
    replicas = {r["replica_id"]: r for r in state.snapshot()["replicas"]}
    assert replicas[a]["weight_version"] == 1 and not replicas[a]["needs_sync"]


def test_failed_receiver_is_dropped_and_flagged_the_rest_commit():
    state, _, notifier, events = make_state()
    a, b = register(state, 7001), register(state, 7002)
    notifier.failing.add("127.0.0.1:7002")
    result = state.commit_push(begin(state, 1).push_id, sender_ok=True)
    assert result.committed and result.current_version == 1
    assert result.acked == [a] and result.dropped == [b]
    assert state.heartbeat(b, 0).needs_sync
    assert not state.heartbeat(a, 1).needs_sync
    assert "needs a weight sync" in acquire(state, b, 1, 0).reason
    (dropped,) = events.of_kind("replica_dropped")
    assert dropped["replica_id"] == b and "failed to load" in dropped["error"]
    assert state.metrics.registry.get_sample_value("asyncrl_controller_replicas_dropped_total") == 1


def test_late_joiner_needs_sync_and_a_resync_push_reaches_only_it():
    state, _, _, events = make_state()
    a = register(state, 7001)
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    assert state.learner_heartbeat(step=1, version=1, consumed=8).sync_requested is False
    registration = state.register("127.0.0.1:7002", "", 0, "torch")
    late = registration.replica_id
    assert registration.needs_sync and registration.current_version == 1
    assert not acquire(state, late, 1, 0).granted
    assert state.learner_heartbeat(step=1, version=1, consumed=8).sync_requested is True
    resync = begin(state, 1)
    assert [(r.replica_id, r.rank) for r in resync.receivers] == [(late, 1)]
    assert resync.plan.world_size == 2
    # No resync request while a push is open: the learner is already doing it.
    assert state.learner_heartbeat(step=1, version=1, consumed=8).sync_requested is False
    result = state.commit_push(resync.push_id, sender_ok=True)
    assert result.committed and result.current_version == 1 and result.acked == [late]
    assert acquire(state, late, 1, 0).granted
    assert events.of_kind("push_committed")[-1]["mode"] == "resync"
    assert a != late


def test_resync_releases_a_held_request():
    state, _, _, _ = make_state()
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    late = register(state, 7002, version=0)
    answer = {}
    holder = threading.Thread(target=lambda: answer.update(d=acquire(state, late, 1, 5.0)))
    holder.start()
    while state.snapshot()["held_requests"] == 0:
        threading.Event().wait(0.01)
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    holder.join(timeout=5)
    assert answer["d"].granted and answer["d"].version == 1


@pytest.mark.parametrize("bad_version", [0, 3, 5])
def test_version_must_be_current_plus_one_or_current(bad_version):
    state, _, _, _ = make_state()
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    with pytest.raises(PushRefused, match=r"^version: must be 2 \(new policy\) or 1 \(resync\)"):
        begin(state, bad_version)
    assert state.current_version == 1


def test_versions_only_grow_and_resync_does_not_bump():
    state, _, _, events = make_state()
    register(state, 7001)
    for version in (1, 1, 2, 2, 3):
        state.commit_push(begin(state, version).push_id, sender_ok=True)
    versions = [e["version"] for e in events.of_kind("push_committed")]
    assert versions == [1, 1, 2, 2, 3] and state.current_version == 3


def test_one_push_at_a_time_until_the_open_one_times_out():
    state, clock, _, events = make_state(push_timeout_s=30.0)
    register(state, 7001)
    first = begin(state, 1)
    with pytest.raises(PushRefused, match="is still open"):
        begin(state, 1)
    clock.advance(31.0)
    second = begin(state, 1)
    (aborted,) = events.of_kind("push_aborted")
    assert aborted["push_id"] == first.push_id
    assert events.of_kind("push_begun")[-1]["aborted_previous"] == first.push_id
    with pytest.raises(PushRefused, match="is not the open push"):
        state.commit_push(first.push_id, sender_ok=True)
    assert state.commit_push(second.push_id, sender_ok=True).committed


def test_a_learner_at_another_store_supersedes_the_open_push_of_the_one_before():
    """A learner killed while its push ran in the background leaves that push open; its replacement (a new
    process: a new rendezvous store) can begin at once instead of waiting out push_timeout_s."""
    state, _, _, events = make_state(push_timeout_s=30.0)
    register(state, 7001)
    orphan = begin(state, 1)
    replacement = state.begin_push(1, PushOffer(store_address="127.0.0.1:29600", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0))
    (aborted,) = events.of_kind("push_aborted")
    assert aborted["push_id"] == orphan.push_id and "superseded by a learner at 127.0.0.1:29600" in aborted["reason"]
    assert replacement.plan.new_group  # the new learner holds no group yet
    assert state.commit_push(replacement.push_id, sender_ok=True).committed and state.current_version == 1


def test_sender_failure_aborts_without_committing_and_flags_receivers():
    state, _, _, events = make_state()
    a = register(state, 7001)
    session = begin(state, 1)
    result = state.commit_push(session.push_id, sender_ok=False, error="broadcast timed out")
    assert not result.committed and result.current_version == 0 and result.dropped == [a]
    assert state.heartbeat(a, 0).needs_sync  # its weights may be half-overwritten
    assert "broadcast timed out" in events.of_kind("push_aborted")[0]["reason"]
    retry = state.commit_push(begin(state, 1).push_id, sender_ok=True)  # a retry of the same version heals it
    assert retry.committed and not state.heartbeat(a, 1).needs_sync


def test_a_receiver_that_never_answers_is_dropped_at_the_push_timeout():
    state, _, notifier, _ = make_state(push_timeout_s=0.3)
    a, b = register(state, 7001), register(state, 7002)
    notifier.hanging.add("127.0.0.1:7002")
    try:
        result = state.commit_push(begin(state, 1).push_id, sender_ok=True)
    finally:
        notifier.release.set()
    assert result.acked == [a] and result.dropped == [b] and result.current_version == 1


def test_duplicate_commit_is_refused():
    state, _, _, _ = make_state()
    session = begin(state, 1)
    state.commit_push(session.push_id, sender_ok=True)
    with pytest.raises(PushRefused, match="no push is open"):
        state.commit_push(session.push_id, sender_ok=True)


def test_push_metrics():
    state, _, _, _ = make_state()
    register(state, 7001)
    state.commit_push(begin(state, 1).push_id, sender_ok=True)
    value = state.metrics.registry.get_sample_value
    assert value("asyncrl_controller_pushes_committed_total") == 1
    assert value("asyncrl_controller_current_version") == 1
    assert value("asyncrl_controller_push_seconds_count") == 1
    assert value("asyncrl_controller_live_replicas") == 1


def commit_waiting(state, session) -> tuple[threading.Thread, dict]:
    """The learner's commit of `session` on a thread, once it waits for the acknowledgements; its result lands
    in the dict under "r"."""
    answer = {}
    committer = threading.Thread(target=lambda: answer.update(r=state.commit_push(session.push_id, True)))
    committer.start()
    while state.books.pushes.slot.phase is not Phase.COMMITTING:
        threading.Event().wait(0.01)
    return committer, answer


def test_a_push_whose_commit_is_waiting_is_not_superseded():
    state, clock, notifier, _ = make_state(push_timeout_s=0.5)
    a = register(state, 7001)
    notifier.hanging.add("127.0.0.1:7001")
    session = begin(state, 1)
    committer, answer = commit_waiting(state, session)
    clock.advance(1.0)  # past push_timeout_s on the state's clock, but its commit is already waiting
    with pytest.raises(PushRefused, match="its commit is in progress"):
        begin(state, 1)
    committer.join(timeout=5)
    notifier.release.set()
    assert answer["r"].committed and answer["r"].dropped == [a]


def test_the_commit_stops_waiting_for_a_receiver_declared_dead():
    """A receiver that hangs (a paused process: its UpdateWeights never answers, its heartbeats stop) used to
    hold the commit for push_timeout_s; once it is declared dead the commit goes on without it."""
    state, clock, notifier, events = make_state(push_timeout_s=60.0, heartbeat_timeout_s=3.0)
    a, b = register(state, 7001), register(state, 7002)
    notifier.hanging.add("127.0.0.1:7002")
    session = begin(state, 1)
    committer, answer = commit_waiting(state, session)
    clock.advance(2.0)
    state.heartbeat(a, 0)
    clock.advance(2.0)  # b silent for 4 s
    state.liveness.reap()
    committer.join(timeout=5)
    assert not committer.is_alive(), "the commit still waits for the dead receiver"
    notifier.release.set()
    result = answer["r"]
    assert result.committed and result.acked == [a] and result.dropped == [b]
    dropped = events.of_kind("replica_dropped")[0]
    assert dropped["replica_id"] == b and dropped["error"].startswith("declared dead during the push")


def test_an_unreachable_receiver_is_dead_at_once_and_the_retry_skips_it():
    """The replica's process is gone (its heartbeat is still fresh): the sender calls the push off (a receiver
    never joined); the controller already knows the address is dead, expires its leases, and the learner's
    retry goes to the others only. A later registration brings it back, needing a sync."""
    state, _, notifier, events = make_state(eta=None)
    a, b = register(state, 7001), register(state, 7002)
    lease = acquire(state, b, 2, 0)
    assert lease.granted
    notifier.gone.add("127.0.0.1:7002")
    first = begin(state, 1)
    first.wait(5)  # both receivers answered (b: unreachable)
    result = state.commit_push(first.push_id, sender_ok=False, error="receivers of rank [2] did not join")
    assert not result.committed
    (dead,) = events.of_kind("replica_dead")
    assert dead["replica_id"] == b and dead["reason"] == "unreachable" and dead["leases_expired"] == 1
    assert [e["reason"] for e in events.of_kind("lease_expired")] == ["unreachable"]
    retry = begin(state, 1)
    assert [r.replica_id for r in retry.receivers] == [a]
    assert state.commit_push(retry.push_id, sender_ok=True).committed
    notifier.gone.clear()
    again = state.register("127.0.0.1:7003", b, 0, "torch")
    assert again.needs_sync and again.current_version == 1


def test_every_push_order_is_signed_with_the_receivers_key():
    """Each order is signed under the receiver's push key, over the plan as that receiver gets it: with its
    own member key of the learner's store (`store_rights.member_plan`), never the store's own."""
    from asyncrl.core.wire.auth import push_order_mac
    from asyncrl.push.store_rights import member_plan

    state, _, notifier, _ = make_state()
    first = state.register("127.0.0.1:7001", "a", 0, "torch")
    second = state.register("127.0.0.1:7002", "b", 0, "torch")
    assert len(first.push_key) == 32 and first.push_key != second.push_key
    session = state.begin_push(1, PushOffer(store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0))
    state.commit_push(session.push_id, sender_ok=True)
    plan = session.plan
    for registration, address in ((first, "127.0.0.1:7001"), (second, "127.0.0.1:7002")):
        rank = next(r.rank for r in session.receivers if r.replica_id == registration.replica_id)
        expected = push_order_mac(registration.push_key, member_plan(plan, rank), rank)
        assert expected != push_order_mac(registration.push_key, plan, rank)
        assert notifier.orders[(address, plan.push_id)] == expected
    # A new registration (a restart) gets a new key: orders signed for the old one no longer verify.
    assert state.register("127.0.0.1:7009", "a", 1, "torch").push_key != first.push_key


def test_pushes_to_the_same_members_reuse_one_broadcast_group():
    """The first push forms a group; later pushes to the same receivers (same ranks, keys, store, transport)
    name the same group and do not form one; the controller counts the groups it formed."""
    state, _, _, events = make_state()
    register(state, 7001), register(state, 7002)
    first = begin(state, 1)
    state.commit_push(first.push_id, sender_ok=True)
    second = begin(state, 2)
    state.commit_push(second.push_id, sender_ok=True)
    assert first.plan.new_group and not second.plan.new_group
    assert first.plan.group_id == second.plan.group_id and first.plan.group_id.startswith("group-")
    assert [e["new_group"] for e in events.of_kind("push_begun")] == [True, False]
    assert state.metrics.groups_formed._value.get() == 1


def test_a_membership_change_or_a_failure_forms_a_new_group():
    state, _, notifier, _ = make_state()
    a = register(state, 7001)
    groups = []

    def push(version, sender_ok=True):
        session = begin(state, version)
        state.commit_push(session.push_id, sender_ok=sender_ok, error="" if sender_ok else "broadcast broke")
        groups.append((session.plan.group_id, session.plan.new_group))

    push(1)
    push(2)  # same members: reused
    b = register(state, 7002)
    push(3)  # a replica joined: new group
    push(4)
    notifier.failing.add("127.0.0.1:7002")
    push(5)  # the failed receiver may have left the group half-used: the next push forms a new one
    notifier.failing.clear()
    state.heartbeat(b, 4)
    push(6)  # the dropped replica is back (force_sync, a push of the new version to all)
    push(7, sender_ok=False)  # the sender failed: aborted, the version is not committed
    push(7)
    push(8)
    key = state.register("127.0.0.1:7001", a, 8, "torch", push_key=b"").push_key  # a restarted replica a
    push(9)
    assert key
    news = [new for _, new in groups]
    assert news == [True, False, True, False, False, True, False, True, False, True], groups
    ids = [group_id for group_id, _ in groups]
    assert ids[0] == ids[1] != ids[2] == ids[3] == ids[4] != ids[5] == ids[6] != ids[7] == ids[8] != ids[9]


def test_the_push_order_mac_is_the_documented_text_under_the_key():
    """rollout.proto documents the signed text (an outside controller must produce it byte for byte)."""
    import dataclasses
    import hashlib
    import hmac

    from asyncrl.core.wire.auth import push_order_mac
    from asyncrl.core.wire.push_contract import TensorMeta
    from asyncrl.push.plan import PushPlan

    plan = PushPlan(push_id="push-v3-ab", version=3, store_address="10.0.0.1:29500", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=(), bucket_bytes=1024, timeout_s=60.0, group_id="group-1",
                    new_group=False, manifest_digest="f" * 64, join_timeout_s=2.5)
    text = "\n".join(["order", "push-v3-ab", "3", "2", "3", "10.0.0.1:29500", TEST_STORE_KEY.hex(), "gloo", "group-1",
                      "0", "f" * 64, "1024", "60000", "2500", ""])
    assert push_order_mac(b"key", plan, 2) == hmac.new(b"key", text.encode(), hashlib.sha256).digest()
    inline = dataclasses.replace(plan, manifest_digest="", tensors=(TensorMeta("w", (2, 3), "float32"),
                                                                    TensorMeta("b", (), "bfloat16")))
    listed = hashlib.sha256(b"w float32 2x3\nb bfloat16 ").hexdigest()
    fields = ["order", "push-v3-ab", "3", "2", "3", "10.0.0.1:29500", TEST_STORE_KEY.hex(), "gloo", "group-1", "0", "",
              "1024", "60000", "2500", listed]
    text = "\n".join(fields)
    assert push_order_mac(b"key", inline, 2) == hmac.new(b"key", text.encode(), hashlib.sha256).digest()
    checked = dataclasses.replace(inline, checksum_in_store=True)  # one more line, last
    assert push_order_mac(b"key", checked, 2) == hmac.new(b"key", (text + "\nchecksum_in_store").encode(),
                                                         hashlib.sha256).digest()  # fmt: skip
    sparse = dataclasses.replace(checked, sparse_deltas=True)  # and one more after it
    assert push_order_mac(b"key", sparse, 2) == hmac.new(
        b"key", (text + "\nchecksum_in_store\nsparse_deltas").encode(), hashlib.sha256).digest()
    # Every field a receiver acts on is signed: changing any one changes the signature.
    for change in ({"bucket_bytes": 2048}, {"timeout_s": 61.0}, {"join_timeout_s": 3.0}, {"store_key": bytes(32)},
                   {"tensors": (TensorMeta("w", (3, 2), "float32"),)}, {"checksum_in_store": True},
                   {"sparse_deltas": True}):
        assert push_order_mac(b"key", dataclasses.replace(inline, **change), 2) != push_order_mac(b"key", inline, 2)


def test_receivers_that_never_joined_sit_out_the_retry_and_come_back_after_their_back_off():
    """A replica that did not join a push (the sender names its rank) is held back: the retry of the same
    version goes without it and commits; it gets no leases (it needs a resync) and no heartbeat brings it
    back; after controller.push_backoff_s it is a receiver again, and a second failure doubles the wait."""
    state, clock, _, events = make_state(push_backoff_s=10.0)
    a, b = register(state, 7001), register(state, 7002)
    failed = begin(state, 1)
    result = state.commit_push(failed.push_id, sender_ok=False, error="ReceiversMissing: rank [2]",
                               missing_ranks=(2,))
    assert not result.committed
    held = events.of_kind("replica_held_back")
    assert [(e["replica_id"], e["seconds"], e["failures"]) for e in held] == [(b, 10.0, 1)]
    assert "did not join the broadcast" in held[0]["problem"]
    pulse = state.heartbeat(b, 0)  # the replica hears why, and for how long
    assert pulse.held_back_s == 10.0 and "did not join the broadcast" in pulse.push_problem
    retry = begin(state, 1)
    assert [r.replica_id for r in retry.receivers] == [a]
    assert state.commit_push(retry.push_id, sender_ok=True).committed
    assert not acquire(state, b, 4, 0).granted  # needs the resync it is held back from
    assert not state.learner_heartbeat(1, 1, 0).sync_requested  # the learner is not asked to resync it yet
    clock.advance(10.0)
    state.heartbeat(b, 0)
    assert state.learner_heartbeat(1, 1, 0).sync_requested
    again = begin(state, 1)  # the resync reaches it now
    assert [r.replica_id for r in again.receivers] == [b]
    state.commit_push(again.push_id, sender_ok=False, error="ReceiversMissing", missing_ranks=(1,))
    assert events.of_kind("replica_held_back")[-1]["seconds"] == 20.0  # doubled
    view = {r["replica_id"]: r for r in state.snapshot()["replicas"]}[b]
    assert view["held_back_s"] == pytest.approx(20.0) and "did not join" in view["push_problem"]


def test_a_push_a_held_back_replica_acknowledges_clears_it():
    """An unreachable receiver is held back too (one that merely failed is resynced at once:
    test_controller_service.py::test_failed_receiver_is_dropped_then_resynced); its heartbeats revive it, but
    only the end of its back-off makes it a receiver again."""
    state, clock, notifier, events = make_state(push_backoff_s=5.0)
    a, b = register(state, 7001), register(state, 7002)
    notifier.gone.add("127.0.0.1:7002")
    result = state.commit_push(begin(state, 1).push_id, sender_ok=True)  # nothing answers at b's address
    assert result.dropped == [b]
    assert events.of_kind("replica_held_back")[0]["problem"].startswith("ReceiverUnreachable: 127.0.0.1:7002")
    state.heartbeat(b, 0)  # revived, still held back
    assert [r.replica_id for r in begin(state, 2).receivers] == [a]
    state.commit_push(state.books.pushes.open.push_id, sender_ok=True)
    notifier.gone.clear()
    clock.advance(5.0)
    state.heartbeat(b, 0)
    session = begin(state, 3)
    assert [r.replica_id for r in session.receivers] == [a, b]
    assert state.commit_push(session.push_id, sender_ok=True).acked == [a, b]
    view = {r["replica_id"]: r for r in state.snapshot()["replicas"]}[b]
    assert view["held_back_s"] == 0 and view["push_problem"] == ""
    assert state.books.registry.get(b).push_failures == 0


def test_receivers_failing_only_because_the_sender_called_the_push_off_are_not_held_back():
    state, _, notifier, events = make_state()
    a, b = register(state, 7001), register(state, 7002)
    notifier.failing.add("127.0.0.1:7001")  # stands for "aborted: called off by the sender"
    session = begin(state, 1)
    session.wait(5.0)  # a's failure is in before the sender reports
    state.commit_push(session.push_id, sender_ok=False, error="ReceiversMissing: rank [2]", missing_ranks=(2,))
    assert [e["replica_id"] for e in events.of_kind("replica_held_back")] == [b]
    assert [r.replica_id for r in begin(state, 1).receivers] == [a]


def test_a_replica_that_never_joins_cannot_shed_its_hold_back_by_registering_again():
    """The attack of a token holder: a fake replica answers its challenges and heartbeats but never joins a
    broadcast, so each push it is in waits out the join time-out. Registering again after each failure (same
    id, or a fresh one from the same host) used to give it a fresh chance at every other push; now its hold-back
    and failure count stay until a push it acknowledges, and a fresh id at its host starts held back as long.
    Replicas elsewhere are not touched."""
    state, clock, _, events = make_state(push_backoff_s=10.0)
    honest = register(state, 7001)
    fake = state.register("10.9.9.9:7002", "fake", 0, "torch")
    failed = begin(state, 1)
    state.commit_push(failed.push_id, sender_ok=False, error="ReceiversMissing: rank [2]", missing_ranks=(2,))
    clock.advance(1.0)
    again = state.register("10.9.9.9:7002", "fake", 0, "torch", push_key=fake.push_key)  # itself, again
    fresh = state.register("10.9.9.9:7003", "", 0, "torch")  # a new id from the same host
    elsewhere = state.register("10.1.1.1:7004", "", 0, "torch")
    retry = begin(state, 1)
    assert [r.replica_id for r in retry.receivers] == [honest, elsewhere.replica_id]
    state.commit_push(retry.push_id, sender_ok=True)
    for replica in (again, fresh):
        pulse = state.heartbeat(replica.replica_id, 1)
        assert pulse.held_back_s == pytest.approx(9.0), pulse
    assert "held back: a replica at 10.9.9.9 failed a push" in state.heartbeat(fresh.replica_id, 1).push_problem
    clock.advance(9.0)  # the back-off is over: both are receivers again, and fail again
    state.heartbeat(honest, 1)
    state.heartbeat(elsewhere.replica_id, 1)
    session = begin(state, 2)
    ranks = {r.replica_id: r.rank for r in session.receivers}
    assert set(ranks) == {honest, "fake", fresh.replica_id, elsewhere.replica_id}
    state.commit_push(session.push_id, sender_ok=False, error="ReceiversMissing",
                      missing_ranks=(ranks["fake"], ranks[fresh.replica_id]))
    seconds = {e["replica_id"]: e["seconds"] for e in events.of_kind("replica_held_back")[-2:]}
    assert seconds == {"fake": 20.0, fresh.replica_id: 20.0}  # doubled across the registrations
    state.register("10.9.9.9:7002", "fake", 0, "torch", push_key=again.push_key)
    assert state.heartbeat("fake", 1).held_back_s == pytest.approx(20.0)
    # A push it acknowledges clears it.
    clock.advance(20.0)
    for rid in (honest, elsewhere.replica_id, fresh.replica_id, "fake"):
        state.heartbeat(rid, 1)
    joined = begin(state, 2)
    assert "fake" in [r.replica_id for r in joined.receivers]
    assert state.commit_push(joined.push_id, sender_ok=True).committed
    assert state.books.registry.get("fake").push_failures == 0


def test_fakes_registered_together_at_one_host_sit_out_together():
    """A token holder's fakes at one host, some registered while a push was under way: when those in a push
    fail to join it, the others there that never joined a push are held back as long, so the fakes cost one
    push per back-off period, not one per batch of registrations. A replica there that joined, and replicas
    elsewhere, are not touched."""
    state, _, _, events = make_state(push_backoff_s=10.0, trust_initial_weights=False)
    honest = register(state, 7001)
    state.commit_push(begin(state, 0).push_id, sender_ok=True)  # honest acknowledges version 0
    fake = state.register("10.9.9.9:7002", "", 0, "torch").replica_id
    joiner = state.register("10.9.9.9:7006", "", 0, "torch").replica_id
    session = begin(state, 1)
    ranks = {r.replica_id: r.rank for r in session.receivers}
    assert set(ranks) == {honest, fake, joiner}
    late = state.register("10.9.9.9:7003", "", 0, "torch").replica_id  # while the push is under way
    elsewhere = state.register("10.1.1.1:7004", "", 0, "torch").replica_id
    state.commit_push(session.push_id, sender_ok=False, error="ReceiversMissing", missing_ranks=(ranks[fake],))
    held = {e["replica_id"]: e["seconds"] for e in events.of_kind("replica_held_back")}
    assert held == {fake: 10.0, late: 10.0}
    assert "held back: a replica at 10.9.9.9 failed a push" in state.heartbeat(late, 0).push_problem
    assert [r.replica_id for r in begin(state, 1).receivers] == [honest, joiner, elsewhere]


def test_a_full_weight_push_commits_only_receivers_that_received_what_was_sent():
    """The learner names the checksum of the full weights it sent; a receiver answering with another one (the
    bytes altered on the way) or none failed the push and needs a resync. A commit naming none is not judged
    (a learner built from the proto alone may not compute one)."""
    state, _, notifier, events = make_state()
    good, altered = register(state, 7001), register(state, 7002)
    sent = "a" * 64
    notifier.adapter_checksums.update({"127.0.0.1:7001": sent, "127.0.0.1:7002": "e" * 64})
    result = state.commit_push(begin(state, 1).push_id, sender_ok=True, adapter_checksum=sent)
    assert result.committed and result.acked == [good] and result.dropped == [altered]
    (dropped,) = events.of_kind("replica_dropped")
    assert "serves weights checksum eeeeeeeeeeee, the learner pushed aaaaaaaaaaaa" in dropped["error"]
    replicas = {r["replica_id"]: r for r in state.snapshot()["replicas"]}
    assert replicas[good]["adapter_verified"] and replicas[altered]["needs_sync"]
    unjudged = state.commit_push(begin(state, 2).push_id, sender_ok=True)
    assert unjudged.committed and sorted(unjudged.acked) == sorted([good, altered])


def test_an_adapter_push_commits_only_receivers_that_serve_the_adapter_sent():
    """LoRA: the commit names the checksum of the adapter sent; a receiver answering with another one (or none:
    an engine that never took it) failed the push, and the snapshot shows who serves what."""
    from asyncrl.core.lora.spec import AdapterSpec
    from asyncrl.core.wire.push_contract import TensorMeta

    state, _, notifier, events = make_state()
    good, stale = register(state, 7001), register(state, 7002)
    sent, other = "a" * 64, "b" * 64
    notifier.adapter_checksums.update({"127.0.0.1:7001": sent, "127.0.0.1:7002": other})
    tensors = (TensorMeta("base_model.model.layer.q_proj.lora_A.weight", (4, 8), "float32"),
               TensorMeta("base_model.model.layer.q_proj.lora_B.weight", (8, 4), "float32"))
    offer = PushOffer(store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, transport="gloo", tensors=tensors, bucket_bytes=1 << 20,
                      timeout_s=5.0, adapter=AdapterSpec(4, 8.0, ("q_proj",)))
    session = state.begin_push(1, offer)
    assert session.plan.adapter == AdapterSpec(4, 8.0, ("q_proj",))
    with pytest.raises(PushRefused, match="adapter_checksum: push .* carries an adapter"):
        state.commit_push(session.push_id, sender_ok=True)
    result = state.commit_push(session.push_id, sender_ok=True, adapter_checksum=sent)
    assert result.committed and result.acked == [good] and result.dropped == [stale]
    (dropped,) = events.of_kind("replica_dropped")
    assert "serves weights checksum bbbbbbbbbbbb, the learner pushed aaaaaaaaaaaa" in dropped["error"]
    replicas = {r["replica_id"]: r for r in state.snapshot()["replicas"]}
    assert (replicas[good]["adapter_checksum"], replicas[good]["adapter_verified"]) == (sent, True)
    assert replicas[stale]["needs_sync"] and not replicas[stale]["adapter_verified"]
    # A heartbeat reports what the replica serves; one older than the push it acknowledged changes nothing.
    state.heartbeat(good, 0, adapter_checksum=other)
    assert state.snapshot()["replicas"][0]["adapter_verified"]
    state.heartbeat(good, 1, adapter_checksum=other)
    assert not state.snapshot()["replicas"][0]["adapter_verified"]
