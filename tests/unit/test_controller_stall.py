"""A controller that stands still (paused, swapped out, its VM migrated) does not count its own stall as the
replicas' silence (`controller.reaper.StallDetector`, `Liveness.forgive_stall`). Measured before, on a
demo with the controller paused 20 s: on resuming it declared both replicas dead and expired their leases."""

from asyncrl.controller.reaper import StallDetector
from tests.fakes import acquire, make_state


def test_the_detector_reports_only_gaps_well_beyond_the_interval():
    now = [100.0]
    detector = StallDetector(1.0, 2.0, clock=lambda: now[0])
    now[0] += 0.4
    assert detector.missed() == 0.0
    now[0] += 2.9  # 1.9 s late: within the threshold
    assert detector.missed() == 0.0
    now[0] += 21.0
    assert detector.missed() == 20.0
    now[0] += 1.0
    assert detector.missed() == 0.0  # measured from the last call, not the start


def test_a_stall_does_not_kill_the_replicas_or_their_leases():
    state, clock, _, events = make_state(eta=None, heartbeat_timeout_s=10.0, lease_ttl_s=15.0)
    state.liveness.watch_stalls(StallDetector(1.0, 2.0, clock=clock))  # what start_reaper sets, on the test's clock
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    b = state.register("127.0.0.1:7002", "", 0, "torch").replica_id
    lease = acquire(state, a, 4, 0)
    clock.advance(20.0)  # nothing ran: not the reaper, not a heartbeat
    state.heartbeat(b, 0)  # the first call after the controller resumed reaps; a has not spoken yet
    assert all(r["alive"] for r in state.snapshot()["replicas"]) and not events.of_kind("replica_dead")
    assert not events.of_kind("lease_expired") and state.admission.complete(a, lease.lease_id, 4) == 0
    assert events.of_kind("controller_stalled")[0]["seconds"] == 19.0
    for _ in range(11):  # the reaper ticking every second; b heartbeats, a stays silent, for real this time
        clock.advance(1.0)
        state.heartbeat(b, 0)
        state.liveness.reap()
    assert [e["replica_id"] for e in events.of_kind("replica_dead")] == [a]


def test_without_the_reaper_silence_is_silence():
    state, clock, _, events = make_state(eta=None, heartbeat_timeout_s=10.0)
    a = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    clock.advance(20.0)
    state.liveness.reap()
    assert [e["replica_id"] for e in events.of_kind("replica_dead")] == [a]
    assert not events.of_kind("controller_stalled")
