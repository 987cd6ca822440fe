"""Difficulty-aware sampling (seed: "What's in Pass@K?": upsample hard questions). The controller keeps a
pass-rate estimate of each prompt from the mean reward its replicas report with each lease completion
(written or skipped alike), and hands a share of the leases a hard prompt to sample again, with a larger group
where `hard_group_size` says so. Pure bookkeeping: the lock, persistence and the wire are the callers'."""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

from asyncrl.core.config.controller import DifficultyConfig


@dataclass
class PromptRecord:
    samples: int = 0
    reward_sum: float = 0.0
    replays: int = 0
    """Times it was handed out again."""

    @property
    def pass_rate(self) -> float:
        """Mean reward per sample (the pass rate with 0/1 rewards)."""
        return self.reward_sum / self.samples if self.samples else 0.0

    def encode(self) -> str:
        return f"{self.samples},{self.reward_sum!r},{self.replays}"

    @staticmethod
    def decode(text: str) -> PromptRecord:
        samples, reward_sum, replays = text.split(",")
        return PromptRecord(int(samples), float(reward_sum), int(replays))


class DifficultyBook:
    """Pass rates by prompt index (the stream prompt a group was generated for), and the pool of hard prompts
    that may be sampled again. `changes()` hands the records to persist since the last call."""

    def __init__(self, cfg: DifficultyConfig, seed: int = 0):
        self.cfg = cfg
        self._records: OrderedDict[int, PromptRecord] = OrderedDict()
        self._pool: list[int] = []
        self._where: dict[int, int] = {}
        """Position of each pooled prompt in `_pool` (removal by swapping with the last)."""
        self._rng = random.Random(seed)
        self._dirty: set[int] = set()
        self._forgotten: list[int] = []
        self.replays_total = 0

    @property
    def enabled(self) -> bool:
        return self.cfg.replay_share > 0

    def observe(self, prompt: int, samples: int, reward_mean: float) -> None:
        """`samples` samples of `prompt` scored `reward_mean` on average."""
        record = self._records.get(prompt)
        if record is None:
            record = self._records[prompt] = PromptRecord()
            while len(self._records) > self.cfg.max_prompts:
                oldest, _ = self._records.popitem(last=False)
                self._unpool(oldest)
                self._dirty.discard(oldest)
                self._forgotten.append(oldest)
        record.samples += samples
        record.reward_sum += reward_mean * samples
        self._dirty.add(prompt)
        self._place(prompt, record)

    def choose(self, room: int | None = None) -> int | None:
        """A hard prompt to sample again for the next lease, or None (the stream's next prompt): with
        probability `replay_share`, when the pool has one. `room`: places left in the current step's share of
        the trajectory budget; where a hard group (`hard_group_size`) would not fit, none is chosen."""
        if not self.enabled or not self._pool or self._rng.random() >= self.cfg.replay_share:
            return None
        if room is not None and room < self.cfg.hard_group_size:
            return None
        prompt = self._pool[self._rng.randrange(len(self._pool))]
        record = self._records[prompt]
        record.replays += 1
        self.replays_total += 1
        self._dirty.add(prompt)
        self._place(prompt, record)
        return prompt

    def group_size(self, asked: int) -> int:
        """Samples in the group of a hard prompt sampled again, for a replica asking for groups of `asked`."""
        return max(self.cfg.hard_group_size, asked)

    def pass_rate(self, prompt: int) -> float | None:
        record = self._records.get(prompt)
        return None if record is None else record.pass_rate

    @property
    def tracked(self) -> int:
        return len(self._records)

    @property
    def hard(self) -> int:
        """Hard prompts that may still be sampled again."""
        return len(self._pool)

    def changes(self) -> tuple[dict[int, str], list[int]]:
        """(encoded records changed, prompts forgotten) since the last call."""
        changed = {prompt: self._records[prompt].encode() for prompt in self._dirty}
        # A prompt forgotten and then heard of again (a late completion) is kept: the store deletes after it writes.
        forgotten = [prompt for prompt in dict.fromkeys(self._forgotten) if prompt not in self._records]
        self._dirty, self._forgotten = set(), []
        return changed, forgotten

    def restore(self, saved: dict[int, str]) -> None:
        """Put the persisted records back (prompt order is the stream's)."""
        for prompt in sorted(saved):
            record = self._records[prompt] = PromptRecord.decode(saved[prompt])
            self.replays_total += record.replays
            self._place(prompt, record)

    def _place(self, prompt: int, record: PromptRecord) -> None:
        if record.pass_rate < self.cfg.hard_below and record.replays < self.cfg.max_replays:
            if prompt not in self._where:
                self._where[prompt] = len(self._pool)
                self._pool.append(prompt)
        else:
            self._unpool(prompt)

    def _unpool(self, prompt: int) -> None:
        at = self._where.pop(prompt, None)
        if at is None:
            return
        last = self._pool.pop()
        if last != prompt:
            self._pool[at] = last
            self._where[last] = at
