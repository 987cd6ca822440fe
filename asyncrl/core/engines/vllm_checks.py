"""A push plan held against the checkpoint a vLLM engine serves, in the engine's own process before anything
is received: every tensor named, shaped and present as vLLM's `load_weights` needs it."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from asyncrl.core.wire.push_contract import PushOrder, match_model

log = logging.getLogger(__name__)


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


def check_plan_against_checkpoint(plan: PushOrder, shapes: dict | None, model_path: str) -> None:
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
