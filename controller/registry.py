"""Replica registry: who the rollout replicas are, where they listen, which weights they hold, are they alive.

Not thread-safe by itself: `ControllerState` owns one and guards it with its lock. Time is passed in (`now`,
seconds on the state's monotonic clock), so tests drive liveness with a fake clock.

A replica joins pushes only once it is *reachable*: it answered the controller's challenge at the address it
registered, under its registration's key (`controller/reachability.py`). An address nobody answers at (a wrong
`rollout.advertise_host`, or a registration from a process that is not a replica there) costs no push.

A replica that fails pushes (it never joins them, or nothing answers at its address) sits out the next ones for
`controller.push_backoff_s`, doubling with each failure (`hold_back`). Only a push it acknowledges clears that:
registering again does not (a token holder's fake replica that answers challenges but never joins a push
used to re-register after each failure and cost every other push the join time-out), and a new registration
at a host whose replicas are held back starts held back as long, and so does one there that never joined a
push (`HostPenalties`: fresh ids from the same place get no fresh chance either).

A replica *needs sync* when the weights it holds are not the current version (a late join, a restart, a
push it missed or failed) or when a failed/aborted push may have left its weights half-overwritten
(`force_sync`). A replica that needs sync gets no leases until a push reaches it.

A replica earns its leases: the version the controller holds for it is one it proved by acknowledging a
push of it (under its registration's key, with the checksum of what it loaded), never one it claims. A
registration is `UNPROVEN` and gets a push of the current version first (at the start of a fresh run, the
learner's push of version 0), and heartbeats report no version. So a token holder's fake replica with no
engine behind it gets leases only by taking in every push as a real replica does. With
`controller.trust_initial_weights` a claim of version 0 (the weights on disk) is believed.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.controller.errors import RegistryFull, UnknownReplica
from asyncrl.core.wire.auth import new_push_key

UNPROVEN = -1
"""The weight version of a replica that claims weights no push of this controller gave it: it needs a sync."""


def believed_version(claimed: int, trust_initial_weights: bool) -> int:
    """The version the controller holds for a registration claiming `claimed`: `UNPROVEN`, or version 0 (the
    weights on disk) when `trust_initial_weights`."""
    return 0 if trust_initial_weights and claimed == 0 else UNPROVEN


@dataclass
class Replica:
    replica_id: str
    address: str
    weight_version: int
    engine: str
    registered_at: float
    last_heartbeat: float
    push_key: bytes = b""
    """Secret of this registration; the controller signs the pushes it orders for the replica with it."""
    alive: bool = True
    force_sync: bool = False
    """Set when a push to this replica failed or was aborted: its weights may be a mix of two versions."""
    push_failures: int = 0
    """Pushes this replica failed in a row by never joining them or being unreachable."""
    held_back_until: float = 0.0
    """Left out of pushes until then (`controller.push_backoff_s`, doubling with `push_failures`)."""
    push_problem: str = ""
    """Why its last push failed, or why it is not reachable (the status page shows it)."""
    reachable: bool = False
    """It answered the controller's challenge at `address` under `push_key`: it may join pushes."""
    reach_failures: int = 0
    """Challenges at this registration's address that got no right answer."""
    dialled_at: float = float("-inf")
    """When the controller last dialled this silent lease holder's address (`Liveness`: gone or not)."""
    dead_reason: str = ""
    """Why it was declared dead (the status page shows it); "" while it lives."""
    adapter_checksum: str = ""
    """The checksum of the LoRA adapter it last reported serving (an ack, a heartbeat); "" for full weights."""
    in_band: bool = False
    """It follows the broadcast groups it joins (`push.in_band`): a push that reuses one may reach it
    through the learner's store instead of an UpdateWeights call."""
    caller_host: str = ""
    """The host its registration came from (the peer, not the address it names): `max_replicas_per_host`."""
    joined_a_push: bool = False
    """It joined a push's broadcast under this registration (it acknowledged one, or the sender saw it join
    one that was called off): until then a hold-back at its host holds it back too (`note_hold_back`)."""

    def needs_sync(self, current_version: int) -> bool:
        return self.force_sync or self.weight_version != current_version

    def pushable(self, now: float) -> bool:
        """Alive, reachable and not held back after failed pushes: a receiver of the next push."""
        return self.alive and self.reachable and now >= self.held_back_until

    def hold_back(self, now: float, backoff_s: float, problem: str) -> float:
        """A failed push: leave this replica out of pushes for backoff_s * 2^(failures so far), at most 32x;
        returns how long."""
        seconds = backoff_s * 2 ** min(self.push_failures, 5)
        self.push_failures += 1
        self.held_back_until, self.push_problem = now + seconds, problem
        return seconds

    def hold_back_unproven(self, now: float, backoff_s: float, failures: int, problem: str) -> float:
        """Not yet reachable after `failures` challenges: left out (it is anyway, unreachable) and told why until
        the next check, backoff_s * 2^failures at most 32x; its push failures are not touched."""
        seconds = backoff_s * 2 ** min(failures, 5)
        self.held_back_until, self.push_problem = max(self.held_back_until, now + seconds), problem
        return seconds

    def proven(self) -> None:
        """It answered its challenge: what held it back for that ends; a hold-back for failed pushes stays."""
        self.reachable = True
        if not self.push_failures:
            self.held_back_until, self.push_problem = 0.0, ""

    def clear_push_failures(self) -> None:
        """It acknowledged a push."""
        self.push_failures, self.held_back_until, self.push_problem = 0, 0.0, ""

    def heartbeat_age(self, now: float) -> float:
        return max(0.0, now - self.last_heartbeat)


class HostPenalties:
    """The longest push hold-back of a replica at each host (the address without its port), so that a new
    registration there starts held back as long, with as many failures: a token holder's fake replica cannot
    shed its hold-back by registering under a fresh id. It applies to registrations made afterwards and
    (`ReplicaRegistry.note_hold_back`) to those there that never joined a push; a penalty ends when its time
    does."""

    def __init__(self):
        self._by_host: dict[str, tuple[float, int, str]] = {}  # host -> (until, failures, problem)

    def note(self, replica: Replica) -> None:
        """`replica` was just held back after a failed push."""
        host = host_of(replica.address)
        until, failures, _ = self._by_host.get(host, (0.0, 0, ""))
        if replica.held_back_until >= until:
            self._by_host[host] = (replica.held_back_until, max(failures, replica.push_failures), replica.push_problem)

    def apply(self, replica: Replica, now: float) -> None:
        """A registration at a host under a penalty starts held back to its end, with its failure count."""
        host = host_of(replica.address)
        until, failures, problem = self._by_host.get(host, (0.0, 0, ""))
        if until <= now:
            self._by_host.pop(host, None)
            return
        if until > replica.held_back_until:
            replica.held_back_until = until
            replica.push_problem = f"held back: a replica at {host} failed a push ({problem})"
        replica.push_failures = max(replica.push_failures, failures)


def host_of(address: str) -> str:
    """"host" of "host:port" ("[::1]:7000" -> "[::1]")."""
    return address.rsplit(":", 1)[0]


class ReplicaRegistry:
    def __init__(self, heartbeat_timeout_s: float, max_replicas: int = 1024, forget_dead_after_s: float = 600.0,
                 max_per_host: int = 0, trust_initial_weights: bool = False):
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.trust_initial_weights = trust_initial_weights
        self.max_replicas = max_replicas
        self.forget_dead_after_s = forget_dead_after_s
        self.max_per_host = max_per_host
        self._replicas: dict[str, Replica] = {}  # insertion order = registration order = rank order
        self.penalties = HostPenalties()
        self._next_number = 1

    def register(
        self, address: str, replica_id: str, weight_version: int, engine: str, now: float, in_band: bool = False,
        caller_host: str = "",
    ) -> Replica:
        """Add a replica, or refresh one that registers again under its id (a restart: new address and weights).
        A new one must find room (`make_room` first) and stay within its caller host's cap. `weight_version` is
        its claim (`believed_version`)."""
        replica_id = replica_id or self._fresh_id()
        existing = self._replicas.get(replica_id)
        if existing is None and self.max_per_host and caller_host:
            from_host = sum(r.caller_host == caller_host for r in self.live())
            if from_host >= self.max_per_host:
                raise RegistryFull(f"{from_host} live replicas registered from {caller_host} "
                                   "(controller.max_replicas_per_host)")
        weight_version = believed_version(weight_version, self.trust_initial_weights)
        if existing is not None:
            existing.address, existing.weight_version, existing.engine = address, weight_version, engine
            existing.in_band, existing.caller_host = in_band, caller_host
            existing.last_heartbeat, existing.alive, existing.force_sync = now, True, False
            existing.dead_reason = ""
            existing.push_key = new_push_key()  # its push failures and hold-back stay: a push it acks clears them
            existing.reachable, existing.reach_failures = False, 0  # a new key and perhaps a new address
            existing.joined_a_push = False
            self.penalties.apply(existing, now)
            return existing
        if len(self._replicas) >= self.max_replicas:
            raise RegistryFull(f"{len(self._replicas)} replicas registered (controller.max_replicas)")
        replica = Replica(replica_id, address, weight_version, engine, registered_at=now, last_heartbeat=now,
                          push_key=new_push_key(), in_band=in_band, caller_host=caller_host)
        self.penalties.apply(replica, now)
        self._replicas[replica_id] = replica
        return replica

    def note_hold_back(self, replica: Replica, now: float) -> list[Replica]:
        """`replica` was just held back after a failed push: a new registration at its host starts held back
        as long (`HostPenalties`), and so does every live one there that never joined a push and holds no
        version (registered a moment earlier, it is no better proven: a token holder's fakes registered
        together would otherwise cost a push each). Returns those it held back."""
        self.penalties.note(replica)
        host = host_of(replica.address)
        peers = [r for r in self.live() if r is not replica and host_of(r.address) == host and not r.joined_a_push
                 and r.weight_version == UNPROVEN and r.held_back_until < replica.held_back_until]
        for peer in peers:
            self.penalties.apply(peer, now)
        return peers

    def restore(self, replica: Replica) -> None:
        """Add a replica saved by an earlier controller (a restart), keeping its id and push key."""
        self._replicas[replica.replica_id] = replica

    def known(self, replica_id: str) -> bool:
        return replica_id in self._replicas

    def get(self, replica_id: str) -> Replica:
        replica = self._replicas.get(replica_id)
        if replica is None:
            raise UnknownReplica("replica_id", f"unknown replica {replica_id[:128]!r} (register first)")
        return replica

    def touch(self, replica: Replica, now: float) -> bool:
        """Record a sign of life; returns True when this revives a replica that had been declared dead."""
        replica.last_heartbeat = now
        revived = not replica.alive
        replica.alive, replica.dead_reason = True, ""
        return revived

    def reap(self, now: float) -> list[Replica]:
        """Declare dead every live replica silent for longer than the heartbeat timeout; returns them."""
        dead = [r for r in self.live() if now - r.last_heartbeat > self.heartbeat_timeout_s]
        for replica in dead:
            replica.alive = False
            replica.dead_reason = (f"silent for {now - replica.last_heartbeat:.0f} s (controller.heartbeat_timeout_s "
                                   f"{self.heartbeat_timeout_s:g} s)")
        return dead

    def make_room(self, replica_id: str) -> Replica | None:
        """For a registration of `replica_id` into a full registry: forget the replica dead the longest (its
        leases expired when it died) and return it, so dead fakes do not hold their slots for
        `forget_dead_after_s`; None when there is room, or the id is registered already, or none is dead."""
        if len(self._replicas) < self.max_replicas or replica_id in self._replicas:
            return None
        dead = [r for r in self._replicas.values() if not r.alive]
        if not dead:
            return None
        oldest = min(dead, key=lambda r: r.last_heartbeat)
        del self._replicas[oldest.replica_id]
        return oldest

    def forget(self, now: float) -> list[Replica]:
        """Remove replicas dead for longer than `forget_dead_after_s` (their leases expired when they died):
        the registry, the status page and GetStatus stay bounded by the live fleet."""
        gone = [r for r in self._replicas.values()
                if not r.alive and now - r.last_heartbeat > self.forget_dead_after_s]
        for replica in gone:
            del self._replicas[replica.replica_id]
        return gone

    def live(self) -> list[Replica]:
        return [r for r in self._replicas.values() if r.alive]

    def all(self) -> list[Replica]:
        return list(self._replicas.values())

    def _fresh_id(self) -> str:
        # Skip numbers a replica already chose for itself explicitly.
        while f"replica-{self._next_number}" in self._replicas:
            self._next_number += 1
        replica_id = f"replica-{self._next_number}"
        self._next_number += 1
        return replica_id
