"""Which adapter versions a vLLM engine keeps loaded.

Every request is pinned to the adapter of the version that was newest when its batch started, and finishes on
it however many pushes land meanwhile. An adapter is retired (unloaded, its files deleted) only when it is
neither among the `keep` newest (at least η + 1: a token of an older version could not be trained anyway) nor
used by a batch still running. Pure bookkeeping; the engine does the loading.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    """One loaded adapter version: where its files are and its checksum."""

    version: int
    path: str
    checksum: str


class AdapterVersions:
    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._loaded: dict[int, Served] = {}
        self._in_use: Counter[int] = Counter()

    @property
    def newest(self) -> Served | None:
        return self._loaded[max(self._loaded)] if self._loaded else None

    @property
    def loaded(self) -> list[int]:
        return sorted(self._loaded)

    def added(self, served: Served) -> list[Served]:
        """`served` is loaded in the engine and now the newest; returns the versions to retire now."""
        if self._loaded and served.version <= max(self._loaded):
            raise ValueError(f"adapter version {served.version} is not newer than {max(self._loaded)}")
        self._loaded[served.version] = served
        return self._retirable()

    def acquire(self) -> Served | None:
        """The adapter a batch starting now runs on (None: the base model, before any adapter arrived)."""
        served = self.newest
        if served is not None:
            self._in_use[served.version] += 1
        return served

    def release(self, served: Served | None) -> list[Served]:
        """A batch on `served` finished; returns the versions to retire now."""
        if served is None:
            return []
        self._in_use[served.version] -= 1
        if self._in_use[served.version] <= 0:
            del self._in_use[served.version]
        return self._retirable()

    def clear(self) -> list[Served]:
        """Every loaded version, now retired (the engine serves the run no more)."""
        gone = [self._loaded[v] for v in sorted(self._loaded)]
        self._loaded.clear()
        self._in_use.clear()
        return gone

    def _retirable(self) -> list[Served]:
        kept = set(sorted(self._loaded)[-self.keep :])
        gone = [self._loaded[v] for v in sorted(self._loaded) if v not in kept and not self._in_use.get(v)]
        for served in gone:
            del self._loaded[served.version]
        return gone


VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM can be set up for (`max_lora_rank`)."""


@dataclass(frozen=True)
class AdapterServing:
    """What a replica's engine must be ready for in a LoRA run: adapters up to `max_rank`, `versions_kept` of them
    loaded at once, for each of `runs` runs (a deployment of several LoRA runs: `asyncrl.core.config.runs`)."""

    max_rank: int
    versions_kept: int
    runs: int = 1

    @classmethod
    def for_run(cls, lora_cfg, eta: int | None) -> AdapterServing | None:
        """From `learner.lora` and `controller.eta` (None when the run trains full weights). A token of a version
        more than η behind cannot be trained: η + 1 versions, and one more for a batch that started on the
        oldest just before a push (η null: 4 in all)."""
        if not lora_cfg.enabled:
            return None
        return cls(lora_cfg.rank, (eta + 2) if eta is not None else 4)

    @property
    def vllm_rank(self) -> int:
        """The smallest rank vLLM can be set up for that holds `max_rank`."""
        for rank in VLLM_RANKS:
            if rank >= self.max_rank:
                return rank
        raise ValueError(f"learner.lora.rank {self.max_rank}: vLLM serves adapters up to rank {VLLM_RANKS[-1]}")
