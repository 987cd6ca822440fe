"""Weight pushes into a running vLLM engine: the worker-side receiver and the checks made before it runs.

vLLM mixes `AsyncRLWorkerExtension` into its worker class (`LLM(worker_extension_cls=WORKER_EXTENSION)`), and
`LLM.collective_rpc("asyncrl_receive_weights", args=(plan_dict, rank))` runs the method on every worker.
Only control data goes through that RPC (the plan as a plain dict); the tensors travel over the push's own
broadcast group (gloo on CPU, nccl on GPU), bucket by bucket, straight into the worker's device memory.

vLLM refuses an extension whose attribute names collide with its worker class, hence the `asyncrl_` prefix
on the extension's methods. The plan checks run in the engine's own process, before anyone joins a group
(`asyncrl.core.engines.vllm_checks`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from asyncrl.core.checks.weights_checksum import WeightsChecksum, check_as_sent, weights_checksum
from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.groups import BroadcastGroups
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import KeptWeights

WORKER_EXTENSION = "asyncrl.push.vllm_worker.AsyncRLWorkerExtension"
"""Qualified name handed to `vllm.LLM(worker_extension_cls=...)`."""

_GROUPS = BroadcastGroups()
"""The broadcast group this worker process keeps between pushes (one worker process per engine)."""
_KEPT = KeptWeights()
"""With sparse deltas: the weights of the last push in checkpoint layout (vLLM's own are repacked), to which
the next one's changes apply."""
_RUN_GROUPS: dict[str, tuple[BroadcastGroups, KeptWeights]] = {}
"""In a replica of several runs: each run's group and kept weights, so one run's push never drops another's
group (each run's learner sends over a group of its own)."""


def _groups_of(run: str) -> tuple[BroadcastGroups, KeptWeights]:
    """The group and kept weights adapter pushes of `run` come through ("": the replica's only run)."""
    if not run:
        return _GROUPS, _KEPT
    if run not in _RUN_GROUPS:
        _RUN_GROUPS[run] = (BroadcastGroups(), KeptWeights())
    return _RUN_GROUPS[run]


def plan_to_dict(plan: PushPlan) -> dict:
    """A plan as plain msgpack-friendly values (every field: vLLM serialises collective_rpc arguments with
    msgpack)."""
    data = {field.name: getattr(plan, field.name) for field in dataclasses.fields(plan)}
    adapter = plan.adapter
    return {**data, "tensors": [[t.name, list(t.shape), t.dtype] for t in plan.tensors],
            "adapter": None if adapter is None else [adapter.rank, adapter.alpha, list(adapter.target_modules)]}


def plan_from_dict(data: dict) -> PushPlan:
    tensors = tuple(TensorMeta(name, tuple(shape), dtype) for name, shape, dtype in data["tensors"])
    adapter = data.get("adapter")
    if adapter is not None:
        adapter = AdapterSpec(int(adapter[0]), float(adapter[1]), tuple(adapter[2]))
    return PushPlan(**{**data, "tensors": tensors, "adapter": adapter})


def refresh_cpu_gemm_of_shared_weights(model: torch.nn.Module) -> None:
    """Rebuild the CPU matmul kernels of layers that keep their weight (embeddings, tied lm_head).

    On CPU, vLLM packs each linear weight into a oneDNN handle when weights are processed. A tied lm_head
    loads nothing itself (its weight is the embedding's), so the layerwise reload hands it back its old
    handle, packed from the old embedding: the logits would keep using the old weights. Re-running the
    layer's processing re-packs from the live weight. Layers without `cpu_linear` (every GPU layer) are
    untouched; layers whose weight was folded into the handle (numel 0) were rebuilt by the reload itself.
    """
    for module in model.modules():
        weight = getattr(module, "weight", None)
        quant_method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() and quant_method:
            quant_method.process_weights_after_loading(module)


class AsyncRLWorkerExtension:
    """Methods added to vLLM's worker (`self` is the worker: it has `model_runner`, `vllm_config`, `device`)."""

    def asyncrl_receive_weights(self, plan_data: dict, rank: int) -> dict:
        """Join the push's broadcast group as `rank`, load every bucket into the model as it arrives.

        Runs while the engine core is paused (the RPC is handled between scheduler steps), so no forward
        pass sees half-loaded weights. Returns figures for the caller's stats.
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        plan = plan_from_dict(plan_data)
        start = time.perf_counter()
        model = self.model_runner.get_model()
        received, buckets = 0, 0
        # Joined before touching the model: a failed join leaves it intact. Weight loaders look up the
        # current vLLM config (quantisation, parallelism), as in vLLM's own weight-transfer engines.
        with _GROUPS.member(plan, rank) as group, torch.no_grad(), set_current_vllm_config(self.vllm_config):
            joined = time.perf_counter()
            # vLLM post-processes loaded weights into kernel layouts (on CPU: repacked linear weights), so a
            # second load must go through its layerwise reload: each layer is rebuilt in checkpoint layout,
            # filled by `load_weights`, then processed and copied into the live kernel tensors.
            initialize_layerwise_reload(model)
            checksum = WeightsChecksum()  # of what arrives, as it arrives: the controller judges it
            try:
                for views in _KEPT.receive(group, plan):
                    for name, tensor in views:
                        checksum.update(name, tensor)
                    # The views point into staging buffers that the next bucket overwrites, while the reload
                    # keeps a layer's tensors until the whole layer has arrived (q, k and v may sit in
                    # different buckets): copy them out (the kept copy of a delta push too: a loader may change
                    # what it is given, and the next delta applies to that copy).
                    named_tensors = [(name, tensor.clone()) for name, tensor in views]
                    # vLLM models take Hugging Face names and do their own fusing (qkv_proj, gate_up_proj).
                    model.load_weights(weights=named_tensors)
                    received += sum(t.numel() * t.element_size() for _, t in named_tensors)
                    buckets += 1
            finally:
                # Also after a broken stream: layers that got nothing get their old tensors back, so the
                # engine stays runnable (the controller re-syncs a replica whose push failed).
                finalize_layerwise_reload(model, self.vllm_config.model_config)
                refresh_cpu_gemm_of_shared_weights(model)
        if group.device.type == "cuda":
            torch.cuda.synchronize(group.device)
        if plan.checksum_in_store:
            # Loaded already (vLLM takes each bucket as it arrives): the push fails, and the controller leases
            # this replica nothing until a resync replaced what it holds.
            check_as_sent(checksum.hexdigest(), _GROUPS.sent_checksum(plan, rank), plan.version)
        return {
            "bytes": received,
            "checksum": checksum.hexdigest(),
            "buckets": buckets,
            "join_s": joined - start,
            "receive_load_s": time.perf_counter() - joined,
        }


    def asyncrl_leave_run(self, run: str) -> None:
        """`run` left this replica: leave the group its pushes came through."""
        groups, _kept = _RUN_GROUPS.pop(run, (None, None))
        if groups is not None:
            groups.close()

    def asyncrl_receive_adapter(self, plan_data: dict, rank: int, directory: str, run: str = "") -> dict:
        """Join an adapter push of `run` as `rank` and write the adapter in peft's format into `directory`, where
        the engine's LoRA loader reads it (`VLLMAdapters`); the model itself is not touched, so generation goes
        on meanwhile. Returns the adapter's checksum and figures."""
        from asyncrl.core.lora.files import write_adapter

        plan = plan_from_dict(plan_data)
        groups, kept = _groups_of(run)
        start = time.perf_counter()
        received: dict[str, torch.Tensor] = {}
        with groups.member(plan, rank) as group:
            for views in kept.receive(group, plan):
                received.update((name, tensor.detach().to("cpu", copy=True)) for name, tensor in views)
        named = [(meta.name, received[meta.name]) for meta in plan.tensors]
        checksum = weights_checksum(named)
        if plan.checksum_in_store:  # before the adapter is written where the engine loads it
            check_as_sent(checksum, groups.sent_checksum(plan, rank), plan.version)
        write_adapter(Path(directory), plan.adapter, named)
        return {"bytes": sum(t.numel() * t.element_size() for _, t in named), "checksum": checksum,
                "receive_write_s": time.perf_counter() - start}
