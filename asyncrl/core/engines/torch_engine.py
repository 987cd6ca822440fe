"""The project's own generation engine: an HF causal LM decoded in torch, with in-flight weight updates.

Generation holds the weight lock only for each forward pass (see `torch_decode.StepGuard`). `update_weights`
runs in another thread: the push lands whole in a spare set of buffers its `WeightSource` keeps (`WeightStream.whole`)
while generation goes on with the live set, then it takes the lock between two decode steps and points the
parameters at the new buffers -- a pointer swap, so generation pauses for microseconds. (A push whose dtypes
differ from the model's is staged and copied, casting, instead.) Tokens sampled from a forward after the
swap carry the new version, and the KV cache computed with the old weights is kept (vLLM's pause mode
"keep").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from asyncrl.core.checks.weights_checksum import check_as_sent, weights_checksum
from asyncrl.core.determinism.invariant_model import use_invariant_kernels
from asyncrl.core.determinism.modes import invariant_engines
from asyncrl.core.engines.base import Engine, Generation, weight_source
from asyncrl.core.engines.merged_adapter import MergedAdapter
from asyncrl.core.engines.torch_decode import generate_with_model, score_in_batches
from asyncrl.core.model.modeling import (
    check_weight_metas,
    copy_weights_,
    eos_token_ids,
    load_causal_lm,
    pad_token_id,
    rebind_parameters,
    weight_slots,
)
from asyncrl.core.model.routing import install_hooks
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats

log = logging.getLogger(__name__)


class TorchEngine(Engine):
    def __init__(self, engine_cfg, model_path: str, dtype: str = "float32", seed: int = 0, version: int = 0,
                 determinism: str = "off", weights: WeightSource | None = None):
        if engine_cfg.threads > 0:
            torch.set_num_threads(engine_cfg.threads)
        self.max_batch_size = engine_cfg.max_batch_size
        self.model = load_causal_lm(model_path, dtype, engine_cfg.device)
        self.model.requires_grad_(False)
        if invariant_engines(determinism):
            use_invariant_kernels(self.model)  # every forward batch invariant (model.determinism)
        # MoE models: every generation carries the experts its tokens were routed to (routing replay).
        self.router_hooks = install_hooks(self.model) if engine_cfg.capture_routing else None
        self.eos_ids = eos_token_ids(self.model)
        self.pad_id = pad_token_id(self.model)
        self.device = next(self.model.parameters()).device
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._version = version
        # Held for each forward pass and for the weight swap: the one thing an update waits for.
        self._weights_lock = threading.Lock()
        # One update at a time (two overlapping broadcasts would interleave their swaps).
        self._update_lock = threading.Lock()
        # Where pushes come from (the broadcast group and the receive buffers kept between pushes); None: an
        # engine that takes no pushes.
        self._weights = weights
        # The model's weight objects by name (rebinding keeps the objects), and the last manifest checked
        # against the model: a push with the same manifest (every push while the membership holds) skips both.
        self._slots = weight_slots(self.model)
        self._checked_metas: tuple = ()
        # LoRA runs: every push is an adapter, merged onto the base weights (`asyncrl.core.engines.merged_adapter`).
        self._adapter = MergedAdapter(self._slots)
        self._weights_checksum = ""
        """The checksum of the full weights the last full push brought ("" before one)."""

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def adapter_checksum(self) -> str:
        return self._adapter.checksum or self._weights_checksum

    @contextlib.contextmanager
    def _forward_step(self):
        with self._weights_lock:
            yield self._version

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, n: int = 1, seeds: list[int] | None = None
    ) -> list[list[Generation]]:
        return generate_with_model(
            self.model,
            prompts,
            params,
            n,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            max_batch_size=self.max_batch_size,
            generator=self._generator,
            step_guard=self._forward_step,
            router_hooks=self.router_hooks,
            seeds=seeds,
        )

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        return score_in_batches(self.model, sequences, response_starts, self.max_batch_size, self.pad_id,
                                lambda _rows: self._weights_lock)

    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        with self._update_lock:
            return self._update_weights(plan, rank)

    def _update_adapter(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        """An adapter push: received (a few MB), merged onto the base weights off the lock, swapped in."""
        started = time.perf_counter()
        try:
            layers = self._adapter.layers(plan)
        except ValueError:
            self._drain(plan, rank)
            raise
        received: dict[str, torch.Tensor] = {}
        with weight_source(self._weights, plan).open(plan, rank) as stream:
            for bucket in stream.buckets():
                received.update((name, tensor.clone()) for name, tensor in bucket)
        received_at = time.perf_counter()
        checksum = weights_checksum((meta.name, received[meta.name]) for meta in plan.tensors)
        if plan.checksum_in_store:
            check_as_sent(checksum, stream.sent_checksum(), plan.version)
        merged = self._adapter.merge(plan, layers, received)
        merge_done = time.perf_counter()
        with self._weights_lock:
            swap_start = time.perf_counter()
            self._adapter.swap_in(merged, checksum)
            self._version = plan.version
            pause_s = time.perf_counter() - swap_start
        log.info("adapter v%d live (merged into %d modules, checksum %s): %.2f MB, %.3fs", plan.version,
                 len(layers), checksum[:12], plan.total_bytes / 2**20, time.perf_counter() - started)
        return WeightUpdateStats(version=plan.version, load_s=time.perf_counter() - started, pause_s=pause_s,
                                 bytes_received=plan.total_bytes, adapter_checksum=checksum,
                                 extra={"receive_s": received_at - started, "merge_s": merge_done - received_at})

    def _update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        if plan.adapter is not None:
            return self._update_adapter(plan, rank)
        started = time.perf_counter()
        if plan.tensors != self._checked_metas:
            try:
                check_weight_metas(self.model, plan.tensors)
            except ValueError:
                # Still take part in the broadcast (and drop what arrives), so the sender and the other
                # receivers are not left waiting for this rank until their time-out.
                self._drain(plan, rank)
                raise
            self._checked_metas = plan.tensors
        staged: list[tuple[str, torch.Tensor]] = []
        with weight_source(self._weights, plan).open(plan, rank) as stream:
            # Receiving straight into parameter storage needs the transport to deliver the model's own dtypes
            # on the model's device; anything else is staged and copied (casting, moving).
            zero_copy = stream.device == self.device and all(
                m.torch_dtype == self._slots[m.name].dtype for m in plan.tensors
            )
            if zero_copy:
                # The push lands in the source's spare buffers; the live ones stay untouched for generation.
                whole = stream.whole()
            else:
                for bucket in stream.buckets():
                    # The bucket views live in reused staging buffers: keep copies until the swap (which
                    # casts them to the model's dtypes).
                    staged.extend((name, tensor.clone()) for name, tensor in bucket)
        # What arrived, off the lock: the controller fails this receiver if it is not what the learner sent.
        arrived = whole if zero_copy else dict(staged)
        checksum = weights_checksum((meta.name, arrived[meta.name]) for meta in plan.tensors)
        if plan.checksum_in_store:  # before the swap: the live weights stay as they are
            check_as_sent(checksum, stream.sent_checksum(), plan.version)
        received = time.perf_counter()
        with self._weights_lock:
            swap_start = time.perf_counter()
            if zero_copy:
                rebind_parameters(self.model, whole, self._slots)
                stream.adopted()
                nbytes = plan.total_bytes
            else:
                nbytes = copy_weights_(self._slots, staged)
            self._adapter.reset()
            self._weights_checksum = checksum
            self._version = plan.version
            pause_s = time.perf_counter() - swap_start
        load_s = time.perf_counter() - started
        log.info(
            "weights v%d live: %.1f MB, receive %.3fs, pause %.6fs (%s)",
            plan.version,
            nbytes / 2**20,
            received - started,
            pause_s,
            "pointer swap" if zero_copy else "copy",
        )
        return WeightUpdateStats(
            version=plan.version,
            load_s=load_s,
            pause_s=pause_s,
            bytes_received=nbytes,
            adapter_checksum=checksum,
            extra={"receive_s": received - started, "zero_copy": float(zero_copy)},
        )

    def _drain(self, plan: PushOrder, rank: int) -> None:
        try:
            with weight_source(self._weights, plan).open(plan, rank) as stream:
                stream.drain()
        except Exception as err:  # noqa: BLE001 - the plan error raised by the caller matters more
            log.warning("could not drain the rejected push %s: %s", plan.push_id, err)

    def close(self) -> None:
        if self._weights is not None:
            self._weights.close()
        with self._weights_lock:
            self.model = None
