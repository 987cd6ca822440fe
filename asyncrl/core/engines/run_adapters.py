"""Several runs' adapters served from one torch model: a replica of a deployment of several LoRA runs.

`SharedTorchModel` holds the base once, with an adapter bank (`asyncrl.core.lora.row_adapters`) of
`SLOTS_PER_RUN` slots per run; `engine_for(run)` is that run's `Engine`, which the run's replica runtime uses
as if it had the model alone. A run's engine serves its newest adapter: each `generate` call is pinned to the
slot live when it starts and every token it samples carries that slot's version (as vLLM pins a batch to its
adapter), so a push never changes a batch's weights halfway. A push is received off every lock, loaded into a
slot of the run's that no batch is pinned to (it waits for one when every slot is pinned: at most the length
of a batch), then made live by one assignment. Before its first push a run's batches run on the base (slot
0), the policy a LoRA run starts from (B = 0).

Runs' batches that wait at the same time are decoded as one (`asyncrl.core.engines.merged_decodes`), each row
through its own run's slot. The torch decode samples a batch with one set of settings, so calls merge when
they sample alike (the same sampling parameters and group size) and their rows fit
`rollout.engine.max_batch_size`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from asyncrl.core.checks.weights_checksum import check_as_sent, weights_checksum
from asyncrl.core.engines.base import Engine, Generation, refuse_full_weights, weight_source
from asyncrl.core.engines.merged_decodes import DecodeCall, MergedDecodes
from asyncrl.core.engines.torch_decode import generate_with_model, score_in_batches
from asyncrl.core.lora.row_adapters import BASE_SLOT, AdapterBank
from asyncrl.core.model.modeling import eos_token_ids, load_causal_lm, pad_token_id
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats

log = logging.getLogger(__name__)

SLOTS_PER_RUN = 3
"""A run's live adapter, the one a batch that started before the last push still runs on, and the next push's:
with three a push waits for a slot only when two batches of the run overlap a push (a replica runs one at a time)."""


class SharedTorchModel:
    """One base model and an adapter bank with slots for `runs` runs' adapters of rank up to `max_rank` on the
    modules `targets` name (the deployment's `asyncrl.core.config.runs.bank_shape`); runs join (`add_run`) and
    leave (`remove_run`) while it serves."""

    def __init__(self, engine_cfg, model_path: str, dtype: str, runs: int, max_rank: int, targets, seed: int = 0):
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
        self.decodes = MergedDecodes(self.max_batch_size)
        """Every run's generate calls, decoded one merged batch at a time."""
        self.forward_lock = threading.Lock()
        """Held by each decode and each scoring pass."""
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

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
        self.decodes.add(run, weight)

    def remove_run(self, run: str) -> None:
        """`run` left (its engine closed, no batch of it running): its slots are free for another."""
        self.decodes.remove(run)
        self._free += self.slots.pop(run, [])

    def close(self) -> None:
        """Nothing to release beyond what the runs' engines release (the model is freed with this object)."""

    def engine_for(self, run: str, weights: WeightSource | None) -> RunEngine:
        """Run `run`'s engine on this model (its pushes through `weights`); `add_run` first."""
        return RunEngine(self, run, weights)

    @torch.no_grad()
    def decode_batch(self, calls: list[DecodeCall]) -> None:
        """Decode `calls` as one batch (each prompt through its call's slot) and hand each call its rows, every
        token tagged with the version its call was pinned to."""
        first = calls[0]
        prompts = [p for call in calls for p in call.prompts]
        seeds = None if first.seeds is None else [s for call in calls for s in call.seeds]
        with self.forward_lock:
            out = generate_with_model(self.model, prompts, first.params, first.n, eos_ids=self.eos_ids,
                                      pad_id=self.pad_id, max_batch_size=self.max_batch_size,
                                      generator=self._generator, seeds=seeds, bank=self.bank,
                                      adapter_slots=[call.adapter for call in calls for _ in call.prompts])
        at = 0
        for call in calls:
            call.result, at = out[at : at + len(call.prompts)], at + len(call.prompts)
            for group in call.result:
                for gen in group:
                    gen.weight_version = [call.version] * len(gen.weight_version)


class RunEngine(Engine):
    """One run's view of a `SharedTorchModel`: its slots, its version, its pushes (see the module's docstring)."""

    def __init__(self, shared: SharedTorchModel, run: str, weights: WeightSource | None):
        self._shared = shared
        self._run = run
        self._own = shared.slots[run]
        self._weights = weights
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
        shared = self._shared
        with self._pinned() as (slot, version):
            call = DecodeCall(self._run, prompts, params, n, seeds, slot, version)
            return shared.decodes.decode(call, shared.decode_batch)

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        shared = self._shared
        with self._pinned() as (slot, _version):

            @contextlib.contextmanager
            def guard(rows: int):
                with shared.forward_lock, shared.bank.rows([slot] * rows):
                    yield

            return score_in_batches(shared.model, sequences, response_starts, shared.max_batch_size,
                                    shared.pad_id, guard)

    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        with self._update_lock:
            return self._update(plan, rank)

    def _update(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        started = time.perf_counter()
        source = weight_source(self._weights, plan)
        if plan.adapter is None:
            refuse_full_weights(source, plan, rank)
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

    def close(self) -> None:
        if self._weights is not None:
            self._weights.close()
