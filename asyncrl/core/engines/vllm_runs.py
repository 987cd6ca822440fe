"""Several runs' adapters served by one vLLM engine: a replica of a deployment of several LoRA runs on vLLM.

`SharedVLLMModel` starts one engine (the base once) with LoRA slots for every run: two per run in a step and
each run's kept versions in host memory (`VLLMAdapters.engine_args`). `engine_for(run)` is that run's `Engine`,
which the run's replica runtime uses as if it had the engine alone. Each run has its own `VLLMAdapters`: its
pushes (received by the worker over that run's group), its versions (η + 2 kept, each batch pinned to the
newest when it starts, every token tagged with it), its directory; vLLM ids come from one counter, so no two
runs' adapters share one.

Runs' batches that wait at the same time go into the engine as one (`asyncrl.core.engines.merged_decodes`):
each request with its own run's adapter, so vLLM's own mixed-LoRA batching serves every run in one forward
per step. vLLM takes sampling settings per request, so any two runs' calls merge while their rows fit
`rollout.engine.max_batch_size`.
"""

from __future__ import annotations

import itertools
import threading

from asyncrl.core.engines.base import Engine, Generation, refuse_full_weights, weight_source
from asyncrl.core.engines.merged_decodes import DecodeCall, MergedDecodes
from asyncrl.core.engines.vllm_adapters import VLLMAdapters
from asyncrl.core.engines.vllm_engine import VLLMEngine
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats


class SharedVLLMModel:
    """One vLLM engine serving the adapters of up to `runs` runs of rank up to `max_rank`, `versions_kept` of
    each loaded at once; runs join (`add_run`) and leave (`remove_run`) while it serves. `worker_extension`: the
    class the engine's worker receives pushes with (`WeightSource.vllm_worker_extension`)."""

    def __init__(self, engine_cfg, model_path: str, dtype: str, runs: int, max_rank: int, versions_kept: int,
                 worker_extension: str, seed: int = 0):  # fmt: skip
        self.serving = AdapterServing(max_rank, versions_kept, runs=runs)
        self.engine = VLLMEngine(engine_cfg, model_path, dtype, seed=seed, adapters=self.serving,
                                 worker_extension=worker_extension)
        self.decodes = MergedDecodes(engine_cfg.max_batch_size, alike=lambda _call, _first: True)
        """Every run's generate calls, one merged batch in the engine at a time."""
        self.runs: set[str] = set()
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()

    def add_run(self, run: str, weight: float = 1.0) -> None:
        """Give `run` its share of the engine (ValueError when it holds `rollout.max_runs` runs already)."""
        if run in self.runs:
            raise ValueError(f"run {run!r} already has slots in this replica's engine")
        if len(self.runs) >= self.serving.runs:
            raise ValueError(f"run {run!r}: this replica's engine has LoRA slots for {self.serving.runs} runs, all "
                             "taken (rollout.max_runs)")
        self.runs.add(run)
        self.decodes.add(run, weight)

    def remove_run(self, run: str) -> None:
        """`run` left (its engine closed, no batch of it running): its share is free for another."""
        self.decodes.remove(run)
        self.runs.discard(run)

    def engine_for(self, run: str, weights: WeightSource | None) -> VLLMRunEngine:
        """Run `run`'s engine on this model (its pushes through `weights`); `add_run` first."""
        return VLLMRunEngine(self, run, weights)

    def new_lora_id(self, _version: int) -> int:
        """A vLLM adapter id no adapter of any run holds (ids are never reused)."""
        with self._ids_lock:
            return next(self._ids)

    def decode_batch(self, calls: list[DecodeCall]) -> None:
        """`calls` through the engine as one batch, each request with its call's adapter, each call handed its
        rows with every token tagged with the version its call was pinned to."""
        from vllm.outputs import RequestOutput

        engine = self.engine
        prompts = [p for call in calls for p in call.prompts]
        params, loras = [], []
        for call in calls:
            if call.seeds is not None and len(call.seeds) != len(call.prompts):
                raise ValueError(f"{len(call.seeds)} seeds for {len(call.prompts)} prompts")
            for i in range(len(call.prompts)):
                params.append(engine.sampling_params(call.params, call.n,
                                                     None if call.seeds is None else call.seeds[i] % 2**31))
                loras.append(call.adapter)
        outputs = engine.run_batch(prompts, params, RequestOutput, loras)
        at = 0
        for call in calls:
            mine, at = outputs[at : at + len(call.prompts)], at + len(call.prompts)
            call.result = [[engine.to_generation(c, call.version, pinned=True) for c in out.outputs] for out in mine]

    def close(self) -> None:
        self.engine.close()


class VLLMRunEngine(Engine):
    """One run's view of a `SharedVLLMModel`: its adapters, its version, its pushes (see the module's docstring)."""

    def __init__(self, shared: SharedVLLMModel, run: str, weights: WeightSource | None):
        self._shared = shared
        self._run = run
        self._weights = weights
        engine = shared.engine
        self.adapters = VLLMAdapters(engine.llm, shared.serving, engine.checkpoint_shapes, engine.control_lock,
                                     run=run, ids=shared.new_lora_id)
        self._version = 0
        """The newest version pushed (0: the base, before the first push)."""
        self._update_lock = threading.Lock()

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def adapter_checksum(self) -> str:
        return self.adapters.checksum

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        shared = self._shared
        with self.adapters.pinned() as (lora, served):
            version = 0 if served is None else served.version
            call = DecodeCall(self._run, prompts, params, n, seeds, lora, version)
            return shared.decodes.decode(call, shared.decode_batch)

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        with self.adapters.pinned() as (lora, _served):
            return self._shared.engine.score_with(sequences, response_starts, lora)

    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        source = weight_source(self._weights, plan)
        if plan.adapter is None:
            refuse_full_weights(source, plan, rank)
        with self._update_lock:
            stats = self.adapters.push(plan, rank, source.worker_args(plan))
            self._version = plan.version
        return stats

    def close(self) -> None:
        self.adapters.unload()
        if self._weights is not None:
            self._weights.close()

