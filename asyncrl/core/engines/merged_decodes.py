"""One decode at a time over a model several runs share, made of the runs' calls that wait together.

Each run's replica calls its engine's `generate` from a thread of its own. The call waits in `MergedDecodes`;
whichever caller finds the model free takes every waiting call that fits (`max_rows`, and alike enough for one
decode) and decodes them as one batch, each row through its own run's adapter, so one forward per step serves
every run (bench/mixed_adapters.py). Which runs' calls go first when not all fit is decided by weighted fair
shares (`RunShares`, `runs[].weight`): a run that has nothing to decode (its learner behind, its η reached)
lends its share and comes back level. Used by both engines' shared models (`run_adapters`, `vllm_runs`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from asyncrl.core.engines.base import Generation
from asyncrl.core.engines.run_shares import RunShares
from asyncrl.core.model.sampling import SamplingParams


@dataclass(eq=False)
class DecodeCall:
    """One run's `generate` call, waiting to be decoded (alone or merged with others')."""

    run: str
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    seeds: list[int] | None
    adapter: object
    """What the engine decodes the call's rows with: a bank slot (torch), a `LoRARequest` or None (vLLM)."""
    version: int
    """The weight version `adapter` serves: every token of the call carries it."""
    result: list[list[Generation]] | None = None
    error: BaseException | None = None
    done: bool = False

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    def samples_like(self, other: DecodeCall) -> bool:
        """Both sample alike, so a decode with one set of sampling settings serves both."""
        return (self.params, self.n, self.seeds is None) == (other.params, other.n, other.seeds is None)


MERGE_WINDOW = 0.25
"""Of the last decode's duration: how long a free model waits for the calls of the runs of the last batch that
have none waiting yet. The run whose batch just ended asks again within milliseconds (its results written, its
next leases taken); without the wait two runs would take turns alone and never merge."""


class MergedDecodes:
    """One decode at a time over the shared model, each made of the waiting calls that fit together."""

    def __init__(self, max_rows: int, alike=DecodeCall.samples_like):
        self.max_rows = max_rows
        """Rows one merged decode takes at most (a first call larger than this is decoded alone)."""
        self._alike = alike
        """`alike(call, first)`: `call` may join a decode that started with `first` (the torch decode samples a
        batch with one set of settings; vLLM takes settings per request, so any two calls merge there)."""
        self._shares = RunShares()
        self._state = threading.Condition()
        self._waiting: list[DecodeCall] = []
        self._decoding = False
        self.merged: list[tuple[str, ...]] = []
        """The runs of each decode so far, in order (the last 1000)."""
        self._last_s = 0.0
        """How long the last decode took."""

    def add(self, run: str, weight: float = 1.0) -> None:
        with self._state:
            self._shares.add(run, weight)

    def remove(self, run: str) -> None:
        with self._state:
            self._shares.remove(run)

    def decode(self, call: DecodeCall, decode_batch) -> list[list[Generation]]:
        """`call`'s result, decoded by whichever caller finds the model free next (`decode_batch(calls)` fills
        each call's result), merged with the calls that fit."""
        with self._state:
            self._waiting.append(call)
            self._state.notify_all()
        while True:
            with self._state:
                self._state.wait_for(lambda: call.done or not self._decoding)
                deadline = time.monotonic() + MERGE_WINDOW * self._last_s
                while not (call.done or self._decoding) and self._missing() and time.monotonic() < deadline:
                    self._state.wait(max(0.0, deadline - time.monotonic()))
                if call.done:
                    break
                if self._decoding:  # another caller took the model meanwhile
                    continue
                batch = self._take()
                self._decoding = True
            started = time.monotonic()
            try:
                _decode_apart_on_failure(batch, decode_batch)
            finally:
                with self._state:
                    for each in batch:
                        if each.result is None and each.error is None:
                            each.error = RuntimeError("the decode this call was part of did not finish")
                        each.done = True
                    self._decoding = False
                    self._last_s = time.monotonic() - started
                    self.merged = [*self.merged[-999:], tuple(each.run for each in batch)]
                    self._state.notify_all()
        if call.error is not None:
            raise call.error
        return call.result

    def _missing(self) -> bool:
        """A run of the last batch has no call waiting (it is about to ask again)."""
        last = self.merged[-1] if self.merged else ()
        return bool(set(last) - {c.run for c in self._waiting})

    def _take(self) -> list[DecodeCall]:
        """The next batch: the first waiting call of the run furthest behind its share, then, by the same order,
        calls that sample alike while their rows fit (taken from the waiting list)."""
        batch: list[DecodeCall] = []
        rows = 0
        while True:
            fits = [c for c in self._waiting if not batch or (self._alike(c, batch[0]) and rows + c.rows <= self.max_rows)]
            if not fits:
                return batch
            # Asking: every run with a call waiting or in this batch (the shares' floor); chosen among those that fit.
            asking = {c.run for c in self._waiting} | {c.run for c in batch}
            run = self._shares.pick(asking, among={c.run for c in fits})
            call = next(c for c in fits if c.run == run)
            self._waiting.remove(call)
            self._shares.granted(run, call.rows)
            batch.append(call)
            rows += call.rows


def _decode_apart_on_failure(batch: list[DecodeCall], decode_batch) -> None:
    """`decode_batch(batch)`; when it fails, each call of a merged batch is decoded alone, so that one run's bad
    call (a prompt its engine refuses) fails that call only, not the other runs' calls it was merged with."""
    try:
        decode_batch(batch)
        return
    except Exception as err:  # noqa: BLE001 - handed to the calls, none hangs
        if len(batch) == 1:
            batch[0].error = err
            return
    for each in batch:
        each.result = None
        try:
            decode_batch([each])
        except Exception as err:  # noqa: BLE001 - this call's own failure
            each.error = err
