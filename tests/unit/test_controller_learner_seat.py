"""The learner's seat (`controller.learner_seat`, `LearnerSeating.register_learner`): only the seated learner's
key passes; the seat stays with a holder that proves itself alive and passes on otherwise; it survives a
controller restart."""

import pytest

from asyncrl.controller.errors import LearnerSeatTaken, LearnerSeatUnconfirmed, NotTheLearner
from asyncrl.controller.persistence import MemoryStore
from asyncrl.controller.state import ControllerState
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.wire.auth import liveness_mac
from tests.fakes import FakeClock, FakeNotifier, MemoryEvents, make_state


def test_only_the_seated_learners_key_passes():
    state, _, _, events = make_state()
    with pytest.raises(NotTheLearner, match="learner_key: no learner holds this run's seat"):
        state.seating.check_learner(b"k" * 32)
    seat = state.seating.register_learner("127.0.0.1:7100")
    assert len(seat.learner_key) == 32 and seat.current_version == 0
    state.seating.check_learner(seat.learner_key)
    with pytest.raises(NotTheLearner, match="learner_key: missing"):
        state.seating.check_learner(b"")
    with pytest.raises(NotTheLearner, match=r"learner_key: not the key .* \(now the learner at 127.0.0.1:7100\)"):
        state.seating.check_learner(seat.learner_key[:-1] + b"x")
    record = events.of_kind("learner_registered")[0]
    assert record["address"] == "127.0.0.1:7100" and record["previous_address"] is None


def test_a_live_holder_keeps_the_seat_and_a_gone_one_loses_it():
    answers, calls = {}, []

    def probe(address, challenge):
        calls.append(address)
        return answers.get(address, lambda _c: b"")(challenge)

    events = MemoryEvents()
    state = ControllerState(ControllerConfig(eta=0), 8, events=events, notify=FakeNotifier(), learner_probe=probe,
                            clock=FakeClock())  # fmt: skip
    first = state.seating.register_learner("127.0.0.1:7100").learner_key
    assert calls == []  # nobody held the seat: nobody to challenge
    answers["127.0.0.1:7100"] = lambda challenge: liveness_mac(first, challenge)
    with pytest.raises(LearnerSeatTaken, match="address: the learner at 127.0.0.1:7100 holds this run's seat"):
        state.seating.register_learner("10.0.0.66:6666")
    assert calls == ["127.0.0.1:7100"]
    state.seating.check_learner(first)  # unchanged
    # A holder answering under another key (a new process at the same address) or not at all loses the seat.
    answers["127.0.0.1:7100"] = lambda challenge: liveness_mac(b"another key", challenge)
    second = state.seating.register_learner("127.0.0.1:7100").learner_key
    assert second != first
    with pytest.raises(NotTheLearner, match="another learner took the seat over"):
        state.seating.check_learner(first)
    third = state.seating.register_learner("127.0.0.1:7200").learner_key
    state.seating.check_learner(third)
    assert [e["previous_address"] for e in events.of_kind("learner_registered")] == [None, "127.0.0.1:7100",
                                                                                     "127.0.0.1:7100"]


def test_a_holder_that_cannot_be_challenged_keeps_the_seat_while_it_heartbeats():
    """No answer either way (None: a time-out, a firewall) is no proof of death: the seat stays with a holder
    heard from within heartbeat_timeout_s (its last heartbeat, or taking the seat) and passes after that
    silence; an answer that proves it gone (b"": nothing listens there) passes it at once."""
    answers = {"10.0.0.1:7100": None}
    clock = FakeClock()
    state = ControllerState(ControllerConfig(eta=0, heartbeat_timeout_s=10.0), 8, notify=FakeNotifier(),
                            learner_probe=lambda address, _challenge: answers[address], clock=clock)
    first = state.seating.register_learner("10.0.0.1:7100").learner_key
    clock.advance(4.0)  # taking the seat counts as being heard from, before any heartbeat
    with pytest.raises(LearnerSeatUnconfirmed, match=r"address: the controller could not challenge the learner "
                                                     r"at 10.0.0.1:7100, .* last heard from 4.0 s ago"):
        state.seating.register_learner("10.0.0.66:6666")
    clock.advance(5.0)
    state.learner_heartbeat(step=1, version=0, consumed=0)
    clock.advance(9.5)
    with pytest.raises(LearnerSeatUnconfirmed, match="last heard from 9.5 s ago"):
        state.seating.register_learner("10.0.0.66:6666")
    state.seating.check_learner(first)
    clock.advance(0.5)  # silent for heartbeat_timeout_s: it passes
    answers["10.0.0.66:6666"] = None
    second = state.seating.register_learner("10.0.0.66:6666").learner_key
    with pytest.raises(NotTheLearner):
        state.seating.check_learner(first)
    # The heartbeat before the seat changed hands was the previous holder's: the new one counts from its seat.
    clock.advance(1.0)
    with pytest.raises(LearnerSeatUnconfirmed, match="last heard from 1.0 s ago"):
        state.seating.register_learner("10.0.0.77:7777")
    state.learner_heartbeat(step=2, version=0, consumed=0)
    answers["10.0.0.66:6666"] = b""  # now nothing listens there: gone, whatever it said a moment ago
    third = state.seating.register_learner("10.0.0.77:7777").learner_key
    state.seating.check_learner(third)
    with pytest.raises(NotTheLearner):
        state.seating.check_learner(second)


def test_the_seat_survives_a_controller_restart():
    store = MemoryStore()
    state, _, _, _ = make_state(store=store)
    key = state.seating.register_learner("127.0.0.1:7100").learner_key
    again, _, _, _ = make_state(store=store)  # the controller died; a new one starts on the saved state
    again.seating.check_learner(key)
    with pytest.raises(NotTheLearner):
        again.seating.check_learner(b"k" * 32)


def test_the_seat_needs_the_learner_secret_fresh_and_once():
    """With a learner secret the seat goes only to a registration that proves it: a fresh proof, made with the
    secret, for that address, never used before. A token holder without the secret is refused even when the
    seat is empty (a dead learner's), and nothing changes hands."""
    from asyncrl.core.wire.learner_secret import PROOF_WINDOW_S, seat_proof

    n1, n2 = b"1" * 16, b"2" * 16

    secret, wall = b"s" * 32, [1_800_000_000.0]
    state = ControllerState(ControllerConfig(eta=0), 8, events=MemoryEvents(), notify=FakeNotifier(),
                            clock=FakeClock(), learner_secret=secret, wall_clock=lambda: wall[0])
    now = int(wall[0])
    with pytest.raises(NotTheLearner, match="seat_proof: missing"):
        state.seating.register_learner("127.0.0.1:7100")
    with pytest.raises(NotTheLearner, match="seat_proof: not made"):
        state.seating.register_learner("127.0.0.1:7100", now, seat_proof(b"x" * 32, "127.0.0.1:7100", now, n1), n1)
    with pytest.raises(NotTheLearner, match="seat_proof: not made"):  # made for another address
        state.seating.register_learner("10.0.0.66:6666", now, seat_proof(secret, "127.0.0.1:7100", now, n1), n1)
    stale = now - int(PROOF_WINDOW_S) - 1
    with pytest.raises(NotTheLearner, match="proof_unix_s: .* from the controller's clock"):
        state.seating.register_learner("127.0.0.1:7100", stale, seat_proof(secret, "127.0.0.1:7100", stale, n1), n1)
    proof = seat_proof(secret, "127.0.0.1:7100", now, n1)
    with pytest.raises(NotTheLearner, match="seat_proof: not made"):  # the proof of another nonce
        state.seating.register_learner("127.0.0.1:7100", now, proof, n2)
    seat = state.seating.register_learner("127.0.0.1:7100", now, proof, n1)
    state.seating.check_learner(seat.learner_key)
    with pytest.raises(NotTheLearner, match="seat_proof: already used"):  # a replay of what went by
        state.seating.register_learner("127.0.0.1:7100", now, proof, n1)
    state.seating.check_learner(seat.learner_key)  # the seat did not change hands
    again = state.seating.register_learner("127.0.0.1:7100", now, seat_proof(secret, "127.0.0.1:7100", now, n2), n2)
    assert again.learner_key != seat.learner_key
