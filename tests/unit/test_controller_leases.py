"""ControllerState leases: admission under η, holding and release, quota return, completion errors."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from asyncrl.controller.errors import InvalidRequest, PreconditionFailed
from asyncrl.controller.persistence import MemoryStore
from asyncrl.controller.reaper import StallDetector
from asyncrl.controller.staleness import admissible
from asyncrl.push.coordinator import PushOffer
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, acquire, make_state


def wait_until(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def publish(state, version):
    """Play the learner: push `version` (the fake notifier acks every receiver) and commit it."""
    session = state.begin_push(version, PushOffer(store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20, timeout_s=5.0))
    return state.commit_push(session.push_id, sender_ok=True)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def test_eta0_grants_one_batch_then_refuses_with_a_reason():
    state, _, _, _ = make_state(batch_size=8, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    first, second = acquire(state, rid, 4, 0), acquire(state, rid, 4, 0)
    assert first.granted and second.granted
    assert (first.prompt_index, second.prompt_index) == (0, 1)  # the training stream, in order
    refused = acquire(state, rid, 4, 0)
    assert not refused.granted
    assert "staleness bound" in refused.reason and refused.version == 0
    assert state.admitted == 8


def test_eta2_allows_three_batches_ahead():
    state, _, _, _ = make_state(batch_size=4, eta=2)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    granted = 0
    while acquire(state, rid, 2, 0).granted:
        granted += 2
    assert granted == 12  # (i + η + 1) * B = 3 * 4


def test_unbounded_eta_never_refuses():
    state, _, _, _ = make_state(batch_size=4, eta=None)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    assert all(acquire(state, rid, 4, 0).granted for _ in range(50))


def test_held_request_is_released_by_the_commit_of_the_next_version(pool):
    state, _, _, _ = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    assert acquire(state, rid, 4, 0).granted
    held = pool.submit(acquire, state, rid, 4, 5.0)
    wait_until(lambda: state.snapshot()["held_requests"] == 1)
    assert not held.done()
    assert publish(state, 1).committed
    decision = held.result(timeout=5)
    assert decision.granted and decision.version == 1 and decision.held_s > 0
    assert state.snapshot()["held_requests"] == 0


def test_hold_ends_with_a_refusal_after_wait_s():
    state, _, _, _ = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    acquire(state, rid, 4, 0)
    start = time.monotonic()
    decision = acquire(state, rid, 1, 0.2)
    assert not decision.granted and 0.15 <= time.monotonic() - start < 2
    assert "staleness bound" in decision.reason


def test_hold_is_capped_by_max_hold_s():
    state, _, _, _ = make_state(batch_size=4, eta=0, max_hold_s=0.1)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    acquire(state, rid, 4, 0)
    start = time.monotonic()
    assert not acquire(state, rid, 1, 60.0).granted
    assert time.monotonic() - start < 2


def test_partial_completion_returns_quota_and_wakes_a_holder(pool):
    state, _, _, events = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    lease = acquire(state, rid, 4, 0)
    held = pool.submit(acquire, state, rid, 2, 5.0)
    wait_until(lambda: state.snapshot()["held_requests"] == 1)
    assert state.admission.complete(rid, lease.lease_id, num_written=2) == 2
    assert held.result(timeout=5).granted
    assert state.admitted == 4  # 4 granted - 2 returned + 2 granted
    (done,) = events.of_kind("lease_completed")
    assert (done["num_written"], done["returned"], done["admitted_after"]) == (2, 2, 2)


def test_expired_lease_returns_its_quota_and_wakes_a_holder(pool):
    state, clock, _, events = make_state(batch_size=4, eta=0, lease_ttl_s=5.0, heartbeat_timeout_s=100.0)
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    b = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    acquire(state, a, 4, 0)
    held = pool.submit(acquire, state, b, 4, 5.0)
    wait_until(lambda: state.snapshot()["held_requests"] == 1)
    clock.advance(6.0)  # past the TTL; the holder's own polling reaps it (no reaper thread here)
    assert held.result(timeout=5).granted
    (expired,) = events.of_kind("lease_expired")
    assert expired["reason"] == "ttl" and expired["returned"] == 4 and expired["admitted_after"] == 0


def test_dead_replica_returns_quota_to_a_waiting_live_one(pool):
    state, clock, _, events = make_state(batch_size=4, eta=0, heartbeat_timeout_s=3.0)
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    b = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    acquire(state, a, 4, 0)
    held = pool.submit(acquire, state, b, 4, 5.0)
    wait_until(lambda: state.snapshot()["held_requests"] == 1)
    clock.advance(2.0)
    state.heartbeat(b, 0)  # b heartbeats while it waits (its request itself counts only when it arrives)
    clock.advance(2.0)  # a silent for 4 s: dead
    assert held.result(timeout=5).granted
    assert [e["replica_id"] for e in events.of_kind("replica_dead")] == [a]
    assert events.of_kind("lease_expired")[0]["reason"] == "replica_dead"


def test_heartbeats_keep_leases_alive():
    state, clock, _, _ = make_state(batch_size=4, eta=0, lease_ttl_s=5.0, heartbeat_timeout_s=100.0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    lease = acquire(state, rid, 4, 0)
    for _ in range(3):
        clock.advance(4.0)
        state.heartbeat(rid, 0)
    assert state.admission.complete(rid, lease.lease_id, 4) == 0


def test_heartbeats_do_not_keep_a_lease_past_lease_max_s():
    """A replica that heartbeats and lists its lease but never completes it (a generation that never ends
    behind a live heartbeat thread, or a client hoarding quota) gets it expired at granted + lease_max_s: at
    η = 0 its quota is the whole next batch, which the other replicas are waiting for."""
    state, clock, _, events = make_state(batch_size=4, eta=0, lease_ttl_s=5.0, lease_max_s=12.0,
                                         heartbeat_timeout_s=100.0)
    hoarder = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    other = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    lease = acquire(state, hoarder, 4, 0)
    for _ in range(5):  # t = 2, 4, ..., 10: the TTL alone would keep it forever
        clock.advance(2.0)
        state.heartbeat(hoarder, 0, held_leases=[lease.lease_id])
        state.heartbeat(other, 0)
    assert not acquire(state, other, 4, 0).granted  # t = 10: still held, the quota with it
    clock.advance(1.9)
    state.heartbeat(hoarder, 0, held_leases=[lease.lease_id])  # t = 11.9: renewed up to t = 12 only
    assert not events.of_kind("lease_expired")
    clock.advance(0.1)  # t = 12 = granted + lease_max_s
    assert acquire(state, other, 4, 0).granted
    (expired,) = events.of_kind("lease_expired")
    assert expired == {**expired, "lease_id": lease.lease_id, "reason": "max_age", "returned": 4, "admitted_after": 0}
    with pytest.raises(PreconditionFailed, match="^lease_id: lease .* is expired: max_age"):
        state.admission.complete(hoarder, lease.lease_id, 4)


def test_lease_max_s_is_moved_on_by_a_controller_stall_and_0_means_no_limit():
    state, clock, _, events = make_state(batch_size=4, eta=None, lease_ttl_s=5.0, lease_max_s=12.0,
                                         heartbeat_timeout_s=100.0)
    state.liveness.watch_stalls(StallDetector(1.0, 2.0, clock=clock))  # what start_reaper sets, on the test's clock
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    lease = acquire(state, rid, 4, 0)
    clock.advance(6.0)  # the controller stood still: 5 s beyond the reaper's interval, which do not count
    state.heartbeat(rid, 0, held_leases=[lease.lease_id])
    assert events.of_kind("controller_stalled")[0]["seconds"] == 5.0
    for _ in range(5):  # t = 8, ..., 16: past granted + 12 s, not past it + 5 s of stall
        clock.advance(2.0)
        state.heartbeat(rid, 0, held_leases=[lease.lease_id])
    assert state.admission.complete(rid, lease.lease_id, 4) == 0 and not events.of_kind("lease_expired")
    unlimited, clock, _, events = make_state(batch_size=4, eta=None, lease_ttl_s=5.0, lease_max_s=0.0,
                                             heartbeat_timeout_s=10_000.0)
    rid = unlimited.register("127.0.0.1:7001", "", 0, "torch").replica_id
    lease = acquire(unlimited, rid, 4, 0)
    for _ in range(1000):  # over an hour of heartbeats
        clock.advance(4.0)
        unlimited.heartbeat(rid, 0, held_leases=[lease.lease_id])
    assert unlimited.admission.complete(rid, lease.lease_id, 4) == 0 and not events.of_kind("lease_expired")


def test_complete_errors():
    state, clock, _, _ = make_state(batch_size=4, eta=0, lease_ttl_s=5.0, heartbeat_timeout_s=100.0)
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    b = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    lease = acquire(state, a, 2, 0)
    with pytest.raises(InvalidRequest, match="^num_written: must be <= the lease's 2"):
        state.admission.complete(a, lease.lease_id, 3)
    with pytest.raises(InvalidRequest, match="^lease_id: .* belongs to replica"):
        state.admission.complete(b, lease.lease_id, 2)
    with pytest.raises(PreconditionFailed, match="unknown lease"):
        state.admission.complete(a, "lease-nope", 0)
    state.admission.complete(a, lease.lease_id, 2)
    with pytest.raises(PreconditionFailed, match="is completed"):
        state.admission.complete(a, lease.lease_id, 2)
    late = acquire(state, a, 2, 0)
    clock.advance(6.0)
    with pytest.raises(PreconditionFailed, match="is expired: ttl"):
        state.admission.complete(a, late.lease_id, 2)


def test_argument_errors_name_the_field():
    state, _, _, _ = make_state(batch_size=4, eta=0)
    with pytest.raises(InvalidRequest, match="^replica_id: unknown replica 'ghost'"):
        acquire(state, "ghost", 1, 0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    with pytest.raises(InvalidRequest, match="^num_trajectories: must be <= batch_size"):
        acquire(state, rid, 5, 0)


def test_prompt_indices_are_not_reissued_after_a_returned_quota():
    state, _, _, _ = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    first = acquire(state, rid, 4, 0)
    state.admission.complete(rid, first.lease_id, 0)
    assert acquire(state, rid, 4, 0).prompt_index == 1


def test_every_admission_in_a_concurrent_run_satisfies_the_rule(pool):
    """The audit the lead's test does on the event log, over a run with holds, returns and commits."""
    state, _, _, events = make_state(batch_size=4, eta=1)
    ids = [state.register(f"127.0.0.1:{7001 + i}", "", 0, "torch").replica_id for i in range(3)]
    stop = threading.Event()

    def worker(rid):
        while not stop.is_set():
            d = acquire(state, rid, 2, 0.2)
            if d.granted:
                state.admission.complete(rid, d.lease_id, 2 if d.prompt_index % 3 else 1)

    futures = [pool.submit(worker, rid) for rid in ids]
    for version in range(1, 6):
        time.sleep(0.05)
        publish(state, version)
    stop.set()
    for f in futures:
        f.result(timeout=10)
    grants = events.of_kind("lease_granted")
    assert len(grants) > 10
    for g in grants:
        assert admissible(g["admitted_after"] - g["n"], g["n"], g["batch_size"], g["version"], g["eta"]), g
    versions = [e["version"] for e in events.of_kind("push_committed")]
    assert versions == sorted(versions) == [1, 2, 3, 4, 5]


def test_heartbeats_keep_only_the_leases_a_replica_still_holds():
    """A lease whose completion never got through is missing from the replica's next heartbeats: once older
    than the grace it expires as abandoned and returns its quota, instead of being kept alive forever."""
    state, clock, _, events = make_state(batch_size=8, eta=None, lease_report_grace_s=2.0, lease_ttl_s=60.0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    kept, lost = acquire(state, rid, 4, 0), acquire(state, rid, 4, 0)
    assert state.admitted == 8
    state.heartbeat(rid, 0, held_leases=[kept.lease_id])  # inside the grace: nothing expires yet
    assert state.admitted == 8
    clock.advance(3.0)
    state.heartbeat(rid, 0, held_leases=[kept.lease_id])
    assert state.admitted == 4
    [expired] = events.of_kind("lease_expired")
    assert expired["lease_id"] == lost.lease_id and expired["reason"] == "abandoned" and expired["returned"] == 4
    # The held one lives on well past its TTL while it is reported...
    for _ in range(30):
        clock.advance(3.0)
        state.heartbeat(rid, 0, held_leases=[kept.lease_id])
    assert state.admission.complete(rid, kept.lease_id, 4) == 0
    # ...and a heartbeat without a report (an older client) keeps every lease alive, as before.
    third = acquire(state, rid, 4, 0)
    clock.advance(10.0)
    state.heartbeat(rid, 0)
    assert state.admission.complete(rid, third.lease_id, 4) == 0


# ---- several leases per call (AcquireLeases / CompleteLeases) -------------------------------------------------


def test_acquire_many_grants_while_admissible_then_says_why_not():
    state, _, _, events = make_state(batch_size=8, eta=1)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    # N_r <= (0 + 1 + 1) * 8 = 16 at version 0: four leases of 4 fit, and a fifth is refused.
    batch = state.admission.try_acquire_many(rid, 4, 5, time.monotonic(), final=True)
    assert [d.prompt_index for d in batch.leases] == [0, 1, 2, 3]
    assert all(d.granted and d.version == 0 for d in batch.leases)
    assert batch.reason.startswith("staleness bound: N_r would reach 20 > (i+eta+1)*B = 16")
    # Each lease's event carries N_r right after it: the audit checks the rule lease by lease.
    grants = events.of_kind("lease_granted")
    assert [g["admitted_after"] for g in grants] == [4, 8, 12, 16]
    for g in grants:
        assert admissible(g["admitted_after"] - g["n"], g["n"], g["batch_size"], g["version"], g["eta"]), g
    # Nothing admissible and not final: held (None); final: no lease, the reason.
    assert state.admission.try_acquire_many(rid, 4, 2, time.monotonic(), final=False) is None
    refused = state.admission.try_acquire_many(rid, 4, 2, time.monotonic(), final=True)
    assert refused.leases == [] and "staleness bound" in refused.reason


def test_acquire_many_that_gets_all_it_asked_for_gives_no_reason_even_at_the_bound():
    state, _, _, _ = make_state(batch_size=8, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    batch = state.admission.try_acquire_many(rid, 4, 2, time.monotonic(), final=True)  # N_r reaches B exactly
    assert len(batch.leases) == 2 and batch.reason == ""


def test_acquire_many_stops_at_max_leases_with_no_reason():
    state, _, _, _ = make_state(batch_size=8, eta=None)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    batch = state.admission.try_acquire_many(rid, 8, 3, time.monotonic(), final=True)
    assert len(batch.leases) == 3 and batch.reason == ""
    assert len({d.lease_id for d in batch.leases}) == 3


def test_acquire_many_is_persisted_once_before_the_answer():
    store = MemoryStore()
    state, _, _, _ = make_state(batch_size=8, eta=None, store=store)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    saves = store.saves
    batch = state.admission.try_acquire_many(rid, 2, 4, time.monotonic(), final=True)
    assert store.saves == saves + 1
    assert set(store.leases) == {d.lease_id for d in batch.leases}


def test_complete_many_settles_each_lease_on_its_own():
    state, _, _, events = make_state(batch_size=8, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    a, b = state.admission.try_acquire_many(rid, 4, 2, time.monotonic(), final=True).leases
    assert not acquire(state, rid, 4, 0).granted  # B = 8 admitted at eta = 0
    outcomes = state.admission.complete_many(rid, [(a.lease_id, 4, None), ("lease-nope", 0, None),
                                                   (b.lease_id, 1, None)])
    assert outcomes[0] == "" and outcomes[2] == ""
    assert outcomes[1].startswith("completions[1].lease_id: unknown lease 'lease-nope'")
    assert [e["num_written"] for e in events.of_kind("lease_completed")] == [4, 1]
    # b's unwritten 3 came back: a lease of 3 fits again, one of 4 does not.
    assert acquire(state, rid, 3, 0).granted and not acquire(state, rid, 1, 0).granted
    late = state.admission.try_acquire_many(rid, 1, 1, time.monotonic(), final=True)
    assert late.leases == []


def test_complete_many_refuses_a_malformed_completion_before_applying_any():
    state, _, _, events = make_state(batch_size=8, eta=None)
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    b = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    mine, theirs = acquire(state, a, 4, 0), acquire(state, b, 4, 0)
    with pytest.raises(InvalidRequest, match=r"^completions\[1\]\.num_written: must be <= the lease's 4"):
        state.admission.complete_many(a, [("lease-gone", 0, None), (mine.lease_id, 5, None)])
    with pytest.raises(InvalidRequest, match=r"^completions\[0\]\.lease_id: .* belongs to replica"):
        state.admission.complete_many(a, [(theirs.lease_id, 4, None), (mine.lease_id, 4, None)])
    assert events.of_kind("lease_completed") == []  # nothing applied
    assert state.admission.complete_many(a, [(mine.lease_id, 4, None)]) == [""]


class CountedWrites:
    """What a Redis buffer's counters would hold (`asyncrl.core.buffer.lease_writes`), in memory."""

    def __init__(self):
        self.written: dict[str, int] = {}
        self.forgotten: list[str] = []

    def counts(self, lease_ids):
        return [self.written.get(i, 0) for i in lease_ids]

    def forget(self, lease_ids):
        self.forgotten += lease_ids
        for i in lease_ids:
            self.written.pop(i, None)


def test_a_completion_counts_at_most_what_reached_the_buffer():
    """A token holder completes η = 0's whole quota as written without writing anything: with the counters the
    controller takes what reached the buffer (nothing), the quota returns and admission goes on; an honest
    replica's completion is taken as it is, and a claim above the count is cut to it."""
    from asyncrl.controller.state import ControllerState
    from asyncrl.core.config.schema import ControllerConfig
    from tests.fakes import FakeClock, FakeNotifier, MemoryEvents

    writes, events = CountedWrites(), MemoryEvents()
    state = ControllerState(ControllerConfig(eta=0, trust_initial_weights=True), 8, events=events, notify=FakeNotifier(), clock=FakeClock(),
                            lease_writes=writes)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    stolen = [acquire(state, rid, 4, 0) for _ in range(2)]
    assert all(lease.granted for lease in stolen) and not acquire(state, rid, 4, 0).granted
    for lease in stolen:
        assert state.admission.complete(rid, lease.lease_id, 4) == 4  # nothing was written: all of it returns
    assert state.admitted == 0 and acquire(state, rid, 4, 0).granted  # admission goes on
    completed = events.of_kind("lease_completed")
    assert [(e["num_written"], e["claimed"], e["returned"]) for e in completed] == [(0, 4, 4)] * 2
    honest = acquire(state, rid, 4, 0)
    writes.written[honest.lease_id] = 4
    assert state.admission.complete(rid, honest.lease_id, 4) == 0
    assert events.of_kind("lease_completed")[-1]["claimed"] is None
    assert not acquire(state, rid, 4, 0).granted  # 8 admitted: the batch is full at η = 0
    assert writes.forgotten == [stolen[0].lease_id, stolen[1].lease_id, honest.lease_id]


def test_the_quota_of_a_group_the_learner_drops_returns_once_and_wakes_a_holder(pool):
    """`learner.stale_groups: drop`: a group read too old to train gives its trajectories back to N_r, so a
    request held at the bound is granted; the same entry again returns nothing (a retried call)."""
    state, _, _, events = make_state(batch_size=4, eta=0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    assert acquire(state, rid, 4, 0).granted  # N_r = 4 = (0 + 0 + 1) x 4: the bound
    held = pool.submit(acquire, state, rid, 2, 5.0)
    wait_until(lambda: state.snapshot()["held_requests"] == 1)
    assert state.admission.return_quota("1-0", 2, "staleness: ...") == (2, 2)
    assert held.result(timeout=5).granted
    assert state.admission.return_quota("1-0", 2, "again") == (0, 4)
    (record,) = events.of_kind("quota_returned")
    assert record == {"kind": "quota_returned", "entry_id": "1-0", "returned": 2, "admitted_after": 2,
                      "reason": "staleness: ...", "prompt_index": None, "lease_id": ""}


def test_a_dropped_groups_prompt_is_generated_again_by_the_next_leases_in_order():
    """ReturnQuota with the group's prompt: the next leases granted sample the queued prompts first, in the
    order they were dropped (their `sample_index`, recorded as regenerated, counted apart from hard-prompt
    replays), then the stream moves on; the queue is saved and a restarted controller keeps it."""
    store = MemoryStore()
    state, _, _, _ = make_state(batch_size=4, eta=None, store=store)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    first = [acquire(state, rid, 2, 0) for _ in range(3)]
    assert [lease.prompt_index for lease in first] == [0, 1, 2]
    state.admission.return_quota("e-2", 2, "staleness: ...", prompt=2, lease_id=first[2].lease_id)
    state.admission.return_quota("e-0", 2, "staleness: ...", prompt=0, lease_id=first[0].lease_id)
    assert state.snapshot()["prompts_to_regenerate"] == 2

    again, _, _, events = make_state(batch_size=4, eta=None, store=store)  # a controller restart
    metrics = again.metrics
    leases = [acquire(again, rid, 2, 0) for _ in range(3)]
    assert [(lease.prompt_index, lease.sample_index) for lease in leases] == [(3, 2), (4, 0), (5, None)]
    granted = events.of_kind("lease_granted")
    assert [g["regenerated"] for g in granted] == [True, True, False]
    assert metrics.prompts_regenerated._value.get() == 2 and metrics.hard_prompt_replays._value.get() == 0
    assert again.snapshot()["prompts_to_regenerate"] == 0


def test_a_group_whose_lease_expired_returns_no_quota_twice_but_its_prompt_is_generated_again():
    """The expiry gave the lease's quota back already: the learner's return of its late group takes nothing more
    from N_r (else admission would run ahead of η), and the prompt is still queued."""
    state, clock, _, events = make_state(batch_size=4, eta=0, lease_ttl_s=5.0, heartbeat_timeout_s=100.0)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    lease = acquire(state, rid, 4, 0)
    clock.advance(6.0)
    state.heartbeat(rid, 0, [])  # reaps the lease: N_r back to 0
    assert state.admitted == 0
    assert state.admission.return_quota("e-0", 4, "staleness: ...", prompt=0, lease_id=lease.lease_id) == (0, 0)
    (record,) = events.of_kind("quota_returned")
    assert record["returned"] == 0 and record["prompt_index"] == 0
    assert acquire(state, rid, 4, 0).sample_index == 0


def test_outstanding_counts_the_active_leases_at_or_below_a_version():
    """What `AwaitLeases` waits on: the active leases granted at a version or below, and the oldest of them."""
    state, _, _, _ = make_state(batch_size=2, eta=None)
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    old = acquire(state, rid, 2, 0)
    assert publish(state, 1).committed
    state.heartbeat(rid, 1, [])
    acquire(state, rid, 2, 0)
    assert state.admission.outstanding(0) == (1, 0) and state.admission.outstanding(1) == (2, 0)
    state.admission.complete(rid, old.lease_id, 2)
    assert state.admission.outstanding(0) == (0, -1) and state.admission.outstanding(1) == (1, 1)
