"""Where the controller's state survives a controller crash: `ControllerStore` (redis | none) and its factory.

What is kept, so a restarted controller continues with exact η accounting:
- meta: the run it belongs to, the committed version, N_r (`admitted`), the prompt cursor, counters, the
  seated learner's key and address;
- the active leases (id, replica, n, prompt index, version at admission);
- the replicas (id, address, engine, the push key of their registration, the version they hold, force_sync,
  whether the controller has reached them at their address, whether they follow broadcast groups), in
  registration order.
What is not: liveness clocks (a restored replica counts as just heard from, a restored lease gets a fresh TTL:
monotonic clocks do not survive a process) and the open push (the learner's commit of a push the new
controller never saw is refused, and the learner begins it again).

Redis layout under `controller.state_key` K: hash `K:meta`, hash `K:leases` (lease id -> JSON), hash
`K:replicas` (replica id -> JSON). The learner's key and the push keys are stored sealed (`key_seal`): a
reader of the store gets no key that signs. Every change is one MULTI/EXEC transaction written under the
controller's lock before the answer leaves, so what a caller was told is what a restart finds.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from asyncrl.controller.key_seal import BrokenSeal, KeySeal
from asyncrl.controller.leases import Lease
from asyncrl.controller.registry import Replica
from asyncrl.core.buffer.lease_writes import LeaseWriteCounts
from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.controller import ControllerConfig
from asyncrl.core.config.schema import BufferConfig

log = logging.getLogger(__name__)


class StateOfAnotherRun(ConfigError):
    """The store holds the state of another run (its run_dir differs)."""


@dataclass
class SavedLease:
    lease_id: str
    replica_id: str
    num_trajectories: int
    prompt_index: int
    version: int
    sample_index: int | None = None


@dataclass
class SavedReplica:
    replica_id: str
    address: str
    engine: str
    push_key: bytes
    weight_version: int
    force_sync: bool
    seq: int
    """Registration order (rank order of pushes)."""
    reachable: bool = True
    """It answered the controller's challenge at its address (True in states saved before this was kept)."""
    in_band: bool = False
    """It follows the broadcast groups it joins (False in states saved before this was kept: pushes then
    reach it through UpdateWeights until it registers again)."""
    caller_host: str = ""
    """Where its registration came from (`controller.max_replicas_per_host`; "" in older states: uncounted)."""


@dataclass
class SavedState:
    run_dir: str
    current_version: int
    admitted: int
    next_prompt_index: int
    granted_total: int = 0
    expired_total: int = 0
    pushes_committed: int = 0
    learner_key: bytes = b""
    """The seated learner's key and address (`controller.learner_seat`): a restarted controller still knows
    which learner holds the seat."""
    learner_address: str = ""
    leases: list[SavedLease] = field(default_factory=list)
    replicas: list[SavedReplica] = field(default_factory=list)
    prompts: dict[int, str] = field(default_factory=dict)
    """Difficulty records by prompt index (`DifficultyBook.restore`)."""
    regenerate: list[int] = field(default_factory=list)
    """Prompts of dropped groups still to be generated again (`LeaseBook.regenerate`)."""


    def summary(self) -> dict:
        return {"version": self.current_version, "admitted": self.admitted,
                "next_prompt_index": self.next_prompt_index, "leases": len(self.leases),
                "replicas": len(self.replicas)}


@dataclass
class Changes:
    """One transaction: the meta fields, the leases and replicas to write and those to delete."""

    meta: dict
    leases: list[SavedLease] = field(default_factory=list)
    ended_leases: list[str] = field(default_factory=list)
    replicas: list[SavedReplica] = field(default_factory=list)
    forgotten_replicas: list[str] = field(default_factory=list)
    prompts: dict[int, str] = field(default_factory=dict)
    forgotten_prompts: list[int] = field(default_factory=list)


class ControllerStore(ABC):
    """The seam. `NoStore` keeps nothing (unit tests, an in-memory buffer)."""

    @abstractmethod
    def load(self) -> SavedState | None:
        """The saved state, or None when nothing was saved."""

    @abstractmethod
    def save(self, changes: Changes) -> None:
        """Apply one set of changes atomically."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything (a run resumed from a checkpoint starts a new controller timeline)."""

    def close(self) -> None:
        """Release connections."""


class NoStore(ControllerStore):
    def load(self) -> SavedState | None:
        return None

    def save(self, changes: Changes) -> None:
        pass

    def clear(self) -> None:
        pass


class MemoryStore(ControllerStore):
    """A store that outlives a `ControllerState` inside one process: unit tests of restore."""

    def __init__(self):
        self.meta: dict = {}
        self.leases: dict[str, SavedLease] = {}
        self.replicas: dict[str, SavedReplica] = {}
        self.prompts: dict[int, str] = {}
        self.saves = 0

    def load(self) -> SavedState | None:
        if not self.meta:
            return None
        return _state(dict(self.meta), list(self.leases.values()), list(self.replicas.values()), dict(self.prompts))

    def save(self, changes: Changes) -> None:
        self.saves += 1
        self.meta.update(changes.meta)
        self.leases.update({lease.lease_id: lease for lease in changes.leases})
        for lease_id in changes.ended_leases:
            self.leases.pop(lease_id, None)
        self.replicas.update({r.replica_id: r for r in changes.replicas})
        for replica_id in changes.forgotten_replicas:
            self.replicas.pop(replica_id, None)
        self.prompts.update(changes.prompts)
        for prompt in changes.forgotten_prompts:
            self.prompts.pop(prompt, None)

    def clear(self) -> None:
        self.meta, self.leases, self.replicas, self.prompts = {}, {}, {}, {}


class RedisStore(ControllerStore):
    def __init__(self, client, key: str, seal: KeySeal | None):
        """`seal`: how the keys are sealed; None for a caller that only clears the store (it cannot save)."""
        self._r, self.key, self._seal = client, key, seal
        self.client = client
        """The Redis connection, for other readers of the buffer's Redis (the lease-write counters)."""
        self._meta, self._leases, self._replicas = f"{key}:meta", f"{key}:leases", f"{key}:replicas"
        self._prompts = f"{key}:prompts"

    def load(self) -> SavedState | None:
        meta = {k.decode(): v.decode() for k, v in self._r.hgetall(self._meta).items()}
        if not meta:
            return None
        leases = [SavedLease(**json.loads(v)) for v in self._r.hvals(self._leases)]
        replicas = []
        for v in self._r.hvals(self._replicas):
            raw = json.loads(v)
            push_key = self._open(raw["push_key"], f"replica {raw['replica_id']!r}: it registers again")
            if push_key:
                replicas.append(SavedReplica(**{**raw, "push_key": push_key}))
        meta["learner_key"] = self._open(meta.get("learner_key", ""), "the learner's seat: it registers again").hex()
        prompts = {int(k): v.decode() for k, v in self._r.hgetall(self._prompts).items()}
        return _state(meta, leases, replicas, prompts)

    def _open(self, text: str, dropped: str) -> bytes:
        """The key sealed as `text`; b"" (logged: what is dropped) when it cannot be opened."""
        try:
            return self._sealer().open(text)
        except BrokenSeal as e:
            log.warning("controller.state_key: a stored key cannot be opened (%s); dropped %s", e, dropped)
            return b""

    def _sealer(self) -> KeySeal:
        if self._seal is None:
            raise RuntimeError("this RedisStore was made without a KeySeal: it can only clear the state")
        return self._seal

    def save(self, changes: Changes) -> None:
        pipe = self._r.pipeline(transaction=True)
        meta = {k: str(v) for k, v in changes.meta.items()}
        if "learner_key" in meta:
            meta["learner_key"] = self._sealer().seal(bytes.fromhex(meta["learner_key"]))
        pipe.hset(self._meta, mapping=meta)
        if changes.leases:
            pipe.hset(self._leases, mapping={x.lease_id: json.dumps(x.__dict__) for x in changes.leases})
        if changes.ended_leases:
            pipe.hdel(self._leases, *changes.ended_leases)
        if changes.replicas:
            pipe.hset(self._replicas, mapping={
                r.replica_id: json.dumps({**r.__dict__, "push_key": self._sealer().seal(r.push_key)})
                for r in changes.replicas
            })  # fmt: skip
        if changes.forgotten_replicas:
            pipe.hdel(self._replicas, *changes.forgotten_replicas)
        if changes.prompts:
            pipe.hset(self._prompts, mapping=changes.prompts)
        if changes.forgotten_prompts:
            pipe.hdel(self._prompts, *changes.forgotten_prompts)
        pipe.execute()

    def clear(self) -> None:
        self._r.delete(self._meta, self._leases, self._replicas, self._prompts)

    def close(self) -> None:
        self._r.close()


class StateWriter:
    """Writes the difference between the controller's state and what it last wrote: a heartbeat that changes
    nothing writes nothing; a grant writes the meta and one lease."""

    def __init__(self, store: ControllerStore):
        self.store = store
        self._meta: dict = {}
        self._leases: set[str] = set()
        self._replicas: dict[str, SavedReplica] = {}

    def write(self, meta: dict, active_leases: dict, replicas: list | None,
              prompts: tuple[dict[int, str], list[int]] = ({}, [])) -> None:
        """`active_leases`: lease id -> `Lease`; `replicas`: every `Replica` in registration order, or None
        when no replica can have changed; `prompts`: the difficulty records changed and forgotten since the
        last write (`DifficultyBook.changes`)."""
        changed_prompts, forgotten_prompts = prompts
        new = [lease for lease_id, lease in active_leases.items() if lease_id not in self._leases]
        ended = [lease_id for lease_id in self._leases if lease_id not in active_leases]
        changed, forgotten, saved = [], [], self._replicas
        if replicas is not None:
            saved = {r.replica_id: SavedReplica(r.replica_id, r.address, r.engine, r.push_key, r.weight_version,
                                                r.force_sync, seq, r.reachable, r.in_band, r.caller_host)
                     for seq, r in enumerate(replicas)}  # fmt: skip
            changed = [r for rid, r in saved.items() if self._replicas.get(rid) != r]
            forgotten = [rid for rid in self._replicas if rid not in saved]
        if meta == self._meta and not (new or ended or changed or forgotten or changed_prompts or forgotten_prompts):
            return
        self.store.save(Changes(
            meta=meta, ended_leases=ended, replicas=changed, forgotten_replicas=forgotten,
            leases=[SavedLease(x.lease_id, x.replica_id, x.num_trajectories, x.prompt_index, x.version,
                               x.sample_index) for x in new],
            prompts=changed_prompts, forgotten_prompts=forgotten_prompts,
        ))  # fmt: skip
        self._meta, self._leases, self._replicas = dict(meta), set(active_leases), saved


def restore_books(saved: SavedState, leases, registry, now: float) -> None:
    """Put the saved leases and replicas back into a `LeaseBook` and a `ReplicaRegistry`: every replica as
    just heard from, every lease with a fresh TTL and age limit (monotonic clocks do not survive a process)."""
    expires_at, ends_by = leases.fresh_clock(now)
    leases.restore(saved.admitted, saved.next_prompt_index, saved.granted_total, saved.expired_total,
                   [Lease(x.lease_id, x.replica_id, x.num_trajectories, x.prompt_index, x.version, granted_at=now,
                          expires_at=expires_at, ends_by=ends_by, sample_index=x.sample_index)
                    for x in saved.leases], saved.regenerate)  # fmt: skip
    for r in saved.replicas:
        registry.restore(Replica(r.replica_id, r.address, r.weight_version, r.engine, registered_at=now,
                                 last_heartbeat=now, push_key=r.push_key, force_sync=r.force_sync,
                                 reachable=r.reachable, in_band=r.in_band, caller_host=r.caller_host))


def _state(meta: dict, leases: list[SavedLease], replicas: list[SavedReplica],
           prompts: dict[int, str]) -> SavedState:
    ints = ("current_version", "admitted", "next_prompt_index", "granted_total", "expired_total", "pushes_committed")
    return SavedState(run_dir=meta.get("run_dir", ""), **{k: int(meta.get(k, 0)) for k in ints},
                      learner_key=bytes.fromhex(meta.get("learner_key", "")),
                      learner_address=meta.get("learner_address", ""),
                      leases=leases, replicas=sorted(replicas, key=lambda r: r.seq), prompts=prompts,
                      regenerate=[int(p) for p in meta.get("regenerate", "").split(",") if p])


def make_store(cfg: ControllerConfig, buffer: BufferConfig, seal: KeySeal | None = None) -> ControllerStore:
    """Factory: the store `cfg.state_store` names, in the Redis of `buffer` for "redis". `seal`: how the
    controller seals the keys it keeps (`KeySeal` of the learner secret); None only to clear the store."""
    kind = cfg.state_store
    if kind == "none":
        return NoStore()
    if kind == "redis":
        from asyncrl.core.buffer.redis_connection import redis_client

        return RedisStore(redis_client(buffer), cfg.state_key, seal)
    raise ValueError(f"controller.state_store: unknown store {kind!r} (expected 'redis' or 'none')")


def lease_write_counts(buffer: BufferConfig, store: ControllerStore) -> LeaseWriteCounts | None:
    """The counter of what reached the Redis buffer under each lease, read over the controller's own Redis
    connection (its state store's); None without one (`controller.state_store: none`) or for another buffer."""
    if buffer.type != "redis" or not isinstance(store, RedisStore):
        return None
    return LeaseWriteCounts(store.client, buffer.stream)
