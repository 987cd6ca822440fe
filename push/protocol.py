"""The push protocol's state, as data: the controller holds one push at a time, in one `PushSlot`.

    phase        what holds the slot
    IDLE         nothing: the next BeginWeightPush opens a push
    OPEN         a push BeginWeightPush answered; the controller orders it (UpdateWeights to every receiver)
    RESERVED     the next push, reserved for the learner at the last commit (it orders it in-band, through its
                 store, without a Begin); no time-out, void at the next Begin or when a receiver registers again
    COMMITTING   CommitWeightPush is waiting for the receivers' answers (outside the controller's lock)

Every change of phase is one `Event`, and `TRANSITIONS` lists every one that is allowed; `PushSlot.fire`
refuses any other (a bug, never a request: the coordinator answers a request the slot cannot take with
`PushRefused` before it fires anything). docs/architecture.md, "Weight push", tells the whole handshake.

A push comes in one of two routes, fixed when it is opened:
- ORDERED: opened by BeginWeightPush; the controller calls `Rollout.UpdateWeights` on each receiver. Every push
  that forms a group, resyncs, or has a receiver that does not follow groups goes this way.
- IN_BAND: reserved at a commit for the learner, on the group every receiver kept and follows; the learner
  writes the order into its store and relays the receivers' signed acks to the commit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

Session = TypeVar("Session")


class PushRefused(Exception):
    """A push request the controller's push state forbids (a push already open, a version that is neither
    current nor current+1, a commit of a push that is not open); the message starts with the request field.
    The service edge answers FAILED_PRECONDITION."""


class Phase(enum.Enum):
    IDLE = "idle"
    OPEN = "open"
    RESERVED = "reserved"
    COMMITTING = "committing"


class Event(enum.Enum):
    BEGIN = "begin"
    """BeginWeightPush opened a push (the slot was emptied first: a reservation withdrawn or aborted, a stale
    open push aborted)."""
    RESERVE = "reserve"
    """A commit reserved the next push for its learner."""
    COMMIT = "commit"
    """CommitWeightPush named the open push, or the reserved one (its learner ordered it)."""
    SETTLE = "settle"
    """The commit's answers are in: the version is committed, the failed receivers dropped."""
    ABORT = "abort"
    """The push is called off: its sender failed, it timed out or was superseded, the timeline was reset, or
    a reserved push's receiver registered again. Its receivers need a resync."""
    WITHDRAW = "withdraw"
    """The learner named the reserved push unused: nobody was ordered to take it."""


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.IDLE, Event.BEGIN): Phase.OPEN,
    (Phase.IDLE, Event.RESERVE): Phase.RESERVED,
    (Phase.OPEN, Event.COMMIT): Phase.COMMITTING,
    (Phase.OPEN, Event.ABORT): Phase.IDLE,
    (Phase.RESERVED, Event.COMMIT): Phase.COMMITTING,
    (Phase.RESERVED, Event.ABORT): Phase.IDLE,
    (Phase.RESERVED, Event.WITHDRAW): Phase.IDLE,
    (Phase.COMMITTING, Event.SETTLE): Phase.IDLE,
    (Phase.COMMITTING, Event.ABORT): Phase.IDLE,
}
"""(phase, event) -> the next phase; a pair not listed is not a transition of the protocol."""


class Route(enum.Enum):
    ORDERED = "ordered"
    IN_BAND = "in_band"


class IllegalTransition(RuntimeError):
    """An event the slot's phase does not take: the coordinator's own bug."""


@dataclass
class PushSlot(Generic[Session]):
    """The one push the controller holds (`session`, None when IDLE) and its phase."""

    phase: Phase = Phase.IDLE
    session: Session | None = None

    def fire(self, event: Event, session: Session | None = None) -> Phase:
        """Apply `event` (`session`: the push a BEGIN or RESERVE puts in the slot); returns the new phase."""
        after = TRANSITIONS.get((self.phase, event))
        if after is None:
            raise IllegalTransition(f"push slot: {event.value} in phase {self.phase.value}")
        if event in (Event.BEGIN, Event.RESERVE):
            if session is None:
                raise IllegalTransition(f"push slot: {event.value} needs the push it opens")
            self.session = session
        self.phase = after
        if after is Phase.IDLE:
            self.session = None
        return after

    def holds(self, *phases: Phase) -> Session | None:
        """The push in the slot when the slot is in one of `phases`, else None."""
        return self.session if self.phase in phases else None
