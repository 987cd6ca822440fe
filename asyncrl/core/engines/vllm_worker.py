"""Weight pushes into a running vLLM engine: the worker-side receiver and the checks made before it runs.

vLLM mixes `AsyncRLWorkerExtension` into its worker class (`LLM(worker_extension_cls=WORKER_EXTENSION)`), and
`LLM.collective_rpc("asyncrl_receive_weights", args=(plan_dict, rank))` runs the method on every worker.
Only control data goes through that RPC (the plan as a plain dict); the tensors travel over the push's own
broadcast group (gloo on CPU, nccl on GPU), bucket by bucket, straight into the worker's device memory.

vLLM refuses an extension whose attribute names collide with its worker class, hence the `asyncrl_` prefix
on the extension's methods. The plan checks run in the engine's own process, before anyone joins a group.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.push.manifest import TensorMeta, match_model
from asyncrl.push.plan import PushPlan
from asyncrl.push.transport.broadcast import receive_weights
from asyncrl.push.transport.groups import BroadcastGroups

log = logging.getLogger(__name__)

WORKER_EXTENSION = "asyncrl.core.engines.vllm_worker.AsyncRLWorkerExtension"
"""Qualified name handed to `vllm.LLM(worker_extension_cls=...)`."""

_GROUPS = BroadcastGroups()
"""The broadcast group this worker process keeps between pushes (one worker process per engine)."""


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
            try:
                for views in receive_weights(group, plan):
                    # The views point into staging buffers that the next bucket overwrites, while the reload
                    # keeps a layer's tensors until the whole layer has arrived (q, k and v may sit in
                    # different buckets): copy them out.
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
        return {
            "bytes": received,
            "buckets": buckets,
            "join_s": joined - start,
            "receive_load_s": time.perf_counter() - joined,
        }


    def asyncrl_receive_adapter(self, plan_data: dict, rank: int, directory: str) -> dict:
        """Join an adapter push as `rank` and write the adapter in peft's format into `directory`, where the
        engine's LoRA loader reads it (`VLLMEngine`); the model itself is not touched, so generation goes on
        meanwhile. Returns the adapter's checksum and figures."""
        from asyncrl.core.lora.files import write_adapter

        plan = plan_from_dict(plan_data)
        start = time.perf_counter()
        received: dict[str, torch.Tensor] = {}
        with _GROUPS.member(plan, rank) as group:
            for views in receive_weights(group, plan):
                received.update((name, tensor.detach().to("cpu", copy=True)) for name, tensor in views)
        named = [(meta.name, received[meta.name]) for meta in plan.tensors]
        checksum = write_adapter(Path(directory), plan.adapter, named)
        return {"bytes": sum(t.numel() * t.element_size() for _, t in named), "checksum": checksum,
                "receive_write_s": time.perf_counter() - start}


# ---- checking a plan against the checkpoint, in the engine's process before anything is received ---------


def checkpoint_tensor_shapes(model_path: str) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor in the checkpoint's safetensors files (headers only, no data read).

    These Hugging Face names are what vLLM's `load_weights` accepts. None when the checkpoint has no local
    safetensors files (then plans are not checked by name).
    """
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def check_plan_against_checkpoint(plan: PushPlan, shapes: dict | None, model_path: str) -> None:
    """Refuse a plan that names a tensor the model lacks, has a wrong shape, or misses one of its weights.

    Two naming schemes are accepted, as vLLM's `load_weights` takes both: the checkpoint's (safetensors
    names) and the transformers model's `state_dict` names (what a learner holding the model in memory sends;
    they differ for MoE models in transformers 5, which fuse the experts). A push must be complete: vLLM
    reloads layer by layer, and a layer that got only part of its tensors (q_proj but not k_proj of the
    fused qkv_proj) would be rebuilt from partly uninitialised memory.
    """
    if shapes is None:
        log.warning("no safetensors files under %s: push %s not checked by name", model_path, plan.push_id)
        return
    names = [meta.name for meta in plan.tensors]
    allowed, required = dict(shapes), set(shapes)
    # Tied embeddings: the checkpoint has no lm_head, but a learner's state dict may carry one (vLLM skips it).
    embedding = next((shape for name, shape in shapes.items() if name.endswith("embed_tokens.weight")), None)
    if "lm_head.weight" not in allowed and embedding is not None:
        allowed["lm_head.weight"] = embedding
    if not set(names) <= allowed.keys():
        in_memory = transformers_tensor_shapes(model_path)
        if in_memory is not None and set(names) <= in_memory[0].keys():
            allowed, required = in_memory
    match_model(plan.tensors, allowed, required, where=f"weight push {plan.push_id} to the model at {model_path}")


def transformers_tensor_shapes(model_path: str) -> tuple[dict[str, tuple[int, ...]], set[str]] | None:
    """The transformers model's `state_dict` shapes and the names a push must carry (parameters, tied ones
    once, and persistent buffers), from a model built on the meta device (no memory). None if transformers
    cannot build it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    except (ValueError, KeyError, OSError) as err:
        log.warning("transformers cannot build the model at %s (%s): checkpoint names only", model_path, err)
        return None
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    required = {name for name, _ in model.named_parameters()}
    required |= {name for name, _ in model.named_buffers() if name in shapes}
    return shapes, required
