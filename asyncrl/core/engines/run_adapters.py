"""Several runs' adapters served from one torch model: a replica of a deployment of several LoRA runs.

`SharedTorchModel` holds the base once, with an adapter bank (`asyncrl.core.lora.row_adapters`) of
`SLOTS_PER_RUN` slots per run; `engine_for(run)` is that run's `Engine`, which the run's replica runtime uses
as if it had the model alone. A run's engine serves its newest adapter: each `generate` call is pinned to the
slot live when it starts and every token it samples carries that slot's version (as vLLM pins a batch to its
adapter), so a push never changes a batch's weights halfway. A push is received off every lock, loaded into a
slot of the run's that no batch is pinned to (it waits for one when every slot is pinned: at most the length
of a batch), then made live by one assignment. Before its first push a run's batches run on the base (slot
0), the policy a LoRA run starts from (B = 0).

The runs' batches take turns on the model one forward (a decode step) at a time, by weighted fair shares
(`FairSteps`, `runs[].weight`): while several runs have a batch under way each gets forwards in proportion to
its weight; a run with none (its learner behind, its η reached) lends its share and comes back level.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from asyncrl.core.checks.weights_checksum import check_as_sent, weights_checksum
from asyncrl.core.engines.base import Engine, Generation, weight_source
from asyncrl.core.engines.run_shares import RunShares
from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.lora.row_adapters import BASE_SLOT, AdapterBank
from asyncrl.core.model.modeling import eos_token_ids, load_causal_lm, pad_token_id
from asyncrl.core.model.prompt_sharing import shared_prompt_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats

log = logging.getLogger(__name__)

SLOTS_PER_RUN = 3
"""A run's live adapter, the one a batch that started before the last push still runs on, and the next push's:
with three a push waits for a slot only when two batches of the run overlap a push (a replica runs one at a time)."""


class FairSteps:
    """The shared model's forwards, one at a time, handed to the runs by weighted fair shares (`RunShares`)."""

    def __init__(self):
        self._shares = RunShares()
        self._state = threading.Condition()
        self._batches: dict[str, int] = {}
        """Run -> its batches under way (a run with one asks for forwards, between its steps too)."""
        self._ready: dict[str, int] = {}
        """Run -> its forwards waiting for a turn now."""
        self._held = False
        self.granted: dict[str, int] = {}
        """Run -> forwards granted so far."""

    def add(self, run: str, weight: float = 1.0) -> None:
        """`run` shares the forwards from now on, level with the runs asking (`RunShares.add`)."""
        with self._state:
            self._shares.add(run, weight)
            self._batches[run] = self._ready[run] = 0
            self.granted.setdefault(run, 0)

    def remove(self, run: str) -> None:
        """`run` asks no more (its batches are over): its share goes to the others."""
        with self._state:
            self._shares.remove(run)
            self._batches.pop(run, None)
            self._ready.pop(run, None)
            self._state.notify_all()

    @contextlib.contextmanager
    def batch(self, run: str):
        """Inside, `run` has a batch under way: it keeps its place in the shares between its steps."""
        with self._state:
            self._batches[run] += 1
        try:
            yield
        finally:
            with self._state:
                self._batches[run] -= 1
                self._state.notify_all()

    @contextlib.contextmanager
    def step(self, run: str):
        """One forward of `run`'s, once it is the asking run furthest behind its share among those ready."""
        with self._state:
            self._ready[run] += 1
            self._state.wait_for(lambda: not self._held and self._next() == run)
            self._ready[run] -= 1
            self._held = True
            self._shares.granted(run, 1)
            self.granted[run] += 1
        try:
            yield
        finally:
            with self._state:
                self._held = False
                self._state.notify_all()

    def _next(self) -> str | None:
        ready = [run for run, n in self._ready.items() if n]
        asking = ready + [run for run, n in self._batches.items() if n]
        return self._shares.pick(asking, among=ready)


class SharedTorchModel:
    """One base model and an adapter bank with slots for `runs` runs' adapters of rank up to `max_rank` on the
    modules `targets` name (the deployment's `asyncrl.core.config.runs.bank_shape`); runs join (`add_run`) and
    leave (`remove_run`) while it serves."""

    def __init__(self, engine_cfg, model_path: str, dtype: str, runs: int, max_rank: int, targets):
        if engine_cfg.threads > 0:
            torch.set_num_threads(engine_cfg.threads)
        self.max_batch_size = engine_cfg.max_batch_size
        self.model = load_causal_lm(model_path, dtype, engine_cfg.device)
        self.model.requires_grad_(False)
        self.eos_ids, self.pad_id = eos_token_ids(self.model), pad_token_id(self.model)
        self.device = next(self.model.parameters()).device
        self.bank = AdapterBank(self.model, targets, slots=SLOTS_PER_RUN * runs, max_rank=max_rank)
        self._free = list(range(1, SLOTS_PER_RUN * runs + 1))
        self.slots: dict[str, list[int]] = {}
        """Run -> the bank slots that are its own."""
        self.steps = FairSteps()
        """Each forward (a decode step of a run's batch, a scoring pass) takes a turn here."""

    def add_run(self, run: str, weight: float = 1.0) -> None:
        """Give `run` slots of its own (ValueError when the bank has none left: `rollout.max_runs`)."""
        if run in self.slots:
            raise ValueError(f"run {run!r} already has slots in this replica's bank")
        if len(self._free) < SLOTS_PER_RUN:
            raise ValueError(f"run {run!r}: this replica's adapter bank is full ({self.bank.slots // SLOTS_PER_RUN} "
                             "runs: rollout.max_runs)")
        self.slots[run], self._free = self._free[:SLOTS_PER_RUN], self._free[SLOTS_PER_RUN:]
        for slot in self.slots[run]:
            self.bank.clear(slot)
        self.steps.add(run, weight)

    def remove_run(self, run: str) -> None:
        """`run` left (its engine closed, no batch of it running): its slots are free for another."""
        self.steps.remove(run)
        self._free += self.slots.pop(run, [])

    def engine_for(self, run: str, weights: WeightSource | None, seed: int = 0) -> RunEngine:
        """Run `run`'s engine on this model (its pushes through `weights`); `add_run` first."""
        return RunEngine(self, run, weights, seed)


class RunEngine(Engine):
    """One run's view of a `SharedTorchModel`: its slots, its version, its pushes (see the module's docstring)."""

    def __init__(self, shared: SharedTorchModel, run: str, weights: WeightSource | None, seed: int):
        self._shared = shared
        self._run = run
        self._own = shared.slots[run]
        self._weights = weights
        self._generator = torch.Generator(device=shared.device).manual_seed(seed)
        self._state = threading.Condition()
        self._live = (BASE_SLOT, 0, "")
        """(slot, version, checksum) served now."""
        self._pins: dict[int, int] = {}
        """Slot -> the batches running on it."""
        self._update_lock = threading.Lock()

    @property
    def weight_version(self) -> int:
        return self._live[1]

    @property
    def adapter_checksum(self) -> str:
        return self._live[2]

    @contextlib.contextmanager
    def _pinned(self):
        """The live (slot, version), kept from being overwritten while the caller's batch runs on it."""
        with self._state:
            slot, version, _ = self._live
            self._pins[slot] = self._pins.get(slot, 0) + 1
        try:
            yield slot, version
        finally:
            with self._state:
                self._pins[slot] -= 1
                self._state.notify_all()

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        shared, run = self._shared, self._run
        with self._pinned() as (slot, version), shared.steps.batch(run):
            @contextlib.contextmanager
            def step():
                with shared.steps.step(run):
                    yield version

            return generate_with_model(shared.model, prompts, params, n, eos_ids=shared.eos_ids,
                                       pad_id=shared.pad_id, max_batch_size=shared.max_batch_size,
                                       generator=self._generator, step_guard=step, seeds=seeds,
                                       bank=shared.bank, adapter_slots=[slot] * len(prompts))

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        shared, out = self._shared, []
        with self._pinned() as (slot, _version):
            for lo in range(0, len(sequences), shared.max_batch_size):
                seqs = sequences[lo : lo + shared.max_batch_size]
                starts = response_starts[lo : lo + shared.max_batch_size]
                with shared.steps.step(self._run), torch.no_grad(), shared.bank.rows([slot] * len(seqs)):
                    logp, _ = shared_prompt_logprobs(shared.model, seqs, starts, pad_id=shared.pad_id)
                rows = logp.cpu().tolist()
                out.extend(row[: len(seq) - start] for row, seq, start in zip(rows, seqs, starts))
        return out

    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        with self._update_lock:
            return self._update(plan, rank)

    def _update(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        started = time.perf_counter()
        source = weight_source(self._weights, plan)
        if plan.adapter is None:
            self._drain(source, plan, rank)
            raise ValueError(f"push {plan.push_id} carries full weights; a run of a deployment of several runs "
                             "serves its adapter on the shared base and takes adapter pushes only")
        received: dict[str, torch.Tensor] = {}
        with source.open(plan, rank) as stream:
            for bucket in stream.buckets():
                received.update((name, tensor.clone()) for name, tensor in bucket)
        checksum = weights_checksum((meta.name, received[meta.name]) for meta in plan.tensors)
        if plan.checksum_in_store:
            check_as_sent(checksum, stream.sent_checksum(), plan.version)
        with self._state:  # a slot of the run's that is neither live nor under a running batch
            self._state.wait_for(lambda: self._free_slot() is not None)
            slot = self._free_slot()
        self._shared.bank.load(slot, plan.adapter, received, where=f"adapter push {plan.push_id}")
        with self._state:
            self._live = (slot, plan.version, checksum)
        log.info("adapter v%d live in slot %d (checksum %s): %.2f MB, %.3fs", plan.version, slot, checksum[:12],
                 plan.total_bytes / 2**20, time.perf_counter() - started)
        return WeightUpdateStats(version=plan.version, load_s=time.perf_counter() - started, pause_s=0.0,
                                 bytes_received=plan.total_bytes, adapter_checksum=checksum)

    def _free_slot(self) -> int | None:
        live = self._live[0]
        return next((s for s in self._own if s != live and not self._pins.get(s)), None)

    @staticmethod
    def _drain(source: WeightSource, plan: PushOrder, rank: int) -> None:
        """Take part in a push refused before it was received, so the sender and the others are not left
        waiting for this rank."""
        try:
            with source.open(plan, rank) as stream:
                stream.drain()
        except Exception as err:  # noqa: BLE001 - the refusal raised by the caller matters more
            log.warning("could not drain the refused push %s: %s", plan.push_id, err)

    def close(self) -> None:
        if self._weights is not None:
            self._weights.close()
