"""The push protocol's state machine (`asyncrl.push.protocol`), as a table: every (phase, event) pair, written
out here by hand, either moves the slot to the phase the protocol documents or is refused, and nothing else
happens. Then the coordinator drives the slot through each path a push takes."""

import pytest

from asyncrl.push.protocol import TRANSITIONS, Event, IllegalTransition, Phase, PushSlot
from tests.conftest import TEST_STORE_KEY
from tests.fakes import TINY_TENSORS, make_state

I, O, R, C = Phase.IDLE, Phase.OPEN, Phase.RESERVED, Phase.COMMITTING
B, RS, CM, S, A, W = Event.BEGIN, Event.RESERVE, Event.COMMIT, Event.SETTLE, Event.ABORT, Event.WITHDRAW

# phase: {event: next phase}; an event missing from a row is refused in that phase.
TABLE = {
    I: {B: O, RS: R},
    O: {CM: C, A: I},
    R: {CM: C, A: I, W: I},
    C: {S: I, A: I},
}


def test_the_table_is_the_protocols():
    assert TRANSITIONS == {(phase, event): after for phase, row in TABLE.items() for event, after in row.items()}


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("event", list(Event))
def test_every_pair_moves_to_the_documented_phase_or_is_refused(phase, event):
    slot = PushSlot(phase=phase, session=None if phase is I else "held")
    after = TABLE[phase].get(event)
    if after is None:
        with pytest.raises(IllegalTransition):
            slot.fire(event, "new")
        assert slot.phase is phase and slot.session == (None if phase is I else "held")
        return
    assert slot.fire(event, "new") is after
    assert slot.phase is after
    expected = None if after is I else ("new" if event in (B, RS) else "held")
    assert slot.session == expected


def test_a_begin_or_a_reservation_needs_the_push_it_puts_in_the_slot():
    with pytest.raises(IllegalTransition, match="needs the push"):
        PushSlot().fire(Event.BEGIN)
    assert PushSlot().holds(Phase.IDLE) is None


def offer(in_band=True):
    from asyncrl.push.plan import PushOffer

    return PushOffer(store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY, transport="gloo", tensors=TINY_TENSORS,
                     bucket_bytes=1 << 20, timeout_s=5.0, in_band=in_band)


def phases(state):
    return state.books.pushes.slot.phase


def test_the_coordinator_walks_the_slot_through_an_ordered_push_then_a_reserved_one():
    state, _, _, _ = make_state()
    for port in (7001, 7002):
        state.register(f"127.0.0.1:{port}", "", 0, "torch", in_band=True)
    assert phases(state) is I
    first = state.begin_push(1, offer())
    assert phases(state) is O and state.books.pushes.open is first
    reserved = state.commit_push(first.push_id, True, reserve_next=True).next_push
    assert phases(state) is R and state.books.pushes.reserved is reserved and state.books.pushes.open is None
    assert reserved.route.value == "in_band" and first.route.value == "ordered"
    # The learner drops it unused (a Begin naming it): withdrawn, then the Begin opens an ordered push.
    second = state.begin_push(2, offer(), unused_push_id=reserved.push_id)
    assert phases(state) is O and state.books.pushes.open is second and not second.in_band
    state.reset_timeline(1, 0, 0)  # aborts it
    assert phases(state) is I and state.books.pushes.open is None
