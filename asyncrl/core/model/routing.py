"""Mixture-of-experts routing: find a model's routers, capture the experts each token went to, force given
experts (routing replay), and the compact wire format of captured routing.

A router here is a Hugging Face "softmax top-k" router module (Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Mixtral, ...)
whose forward returns `(router_logits, gate_weights, expert_ids)` over the flattened tokens of a batch.
`RouterHooks` puts one forward hook on each: the hook can record the ids the router chose and can replace
them with forced ids. Forced gate weights are recomputed from the router's current logits over the forced
experts (softmax, then renormalised over the top-k when the router does), so gradients still reach the
router -- the replay lives inside the MoE blocks, not in the training loop, and works wherever the model runs.

Wire format (`asyncrl.v1.RoutedExperts`): ids row-major [num_tokens, num_layers, top_k], one byte each when
the model has at most 256 experts, else two bytes little-endian.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from asyncrl.core.model.modeling import checkpoint_config

# Router classes whose forward is softmax -> top-k (-> renormalise): class name -> renormalises always
# (Mixtral has no norm_topk_prob attribute and always renormalises; the others follow norm_topk_prob).
_SOFTMAX_TOPK_ROUTERS = {
    "MixtralTopKRouter": True,
    "Qwen2MoeTopKRouter": False,
    "Qwen3MoeTopKRouter": False,
    "Qwen3NextTopKRouter": False,
    "Qwen3_5MoeTopKRouter": False,
    "Qwen3VLMoeTextTopKRouter": False,
}
MAX_EXPERTS = 1 << 16


class UnsupportedRouter(ValueError):
    """The model has MoE routers whose routing rule this module does not reproduce."""


@dataclass(frozen=True)
class RoutingShape:
    """What one token's routing looks like for a model."""

    num_layers: int
    top_k: int
    num_experts: int

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.top_k * id_dtype(self.num_experts).itemsize


@dataclass
class RoutedExperts:
    """The experts every computed token of one sequence was routed to."""

    ids: np.ndarray
    """Integer array [num_tokens, num_layers, top_k]: prompt tokens then response tokens, in order."""
    num_experts: int


def id_dtype(num_experts: int) -> np.dtype:
    """Wire dtype of an expert id: uint8 up to 256 experts, little-endian uint16 up to 65536."""
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts must be in [1, {MAX_EXPERTS}], got {num_experts}")
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype("<u2")


def write_proto(routed: RoutedExperts, message) -> None:
    """Fill an `asyncrl.v1.RoutedExperts` message."""
    ids = np.asarray(routed.ids)
    if ids.ndim != 3:
        raise ValueError(f"routed expert ids must be [tokens, layers, top_k], got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= routed.num_experts):
        raise ValueError(f"routed expert ids must be in [0, {routed.num_experts})")
    message.num_tokens, message.num_layers, message.top_k = (int(d) for d in ids.shape)
    message.num_experts = routed.num_experts
    message.expert_ids = np.ascontiguousarray(ids, dtype=id_dtype(routed.num_experts)).tobytes()


def read_proto(message) -> RoutedExperts:
    """Decode an `asyncrl.v1.RoutedExperts` message; ValueError naming the field that does not add up."""
    shape = (message.num_tokens, message.num_layers, message.top_k)
    if min(shape) < 1:
        raise ValueError(f"routed_experts: num_tokens, num_layers and top_k must be >= 1, got {shape}")
    try:
        dtype = id_dtype(message.num_experts)
    except ValueError as err:
        raise ValueError(f"routed_experts.num_experts: {err}") from None
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(message.expert_ids) != expected:
        raise ValueError(
            f"routed_experts.expert_ids: {len(message.expert_ids)} bytes, expected {expected} for shape {shape} "
            f"with {dtype.itemsize}-byte ids"
        )
    ids = np.frombuffer(message.expert_ids, dtype=dtype).reshape(shape)
    if ids.size and int(ids.max()) >= message.num_experts:
        raise ValueError(f"routed_experts.expert_ids: an id is >= num_experts ({message.num_experts})")
    return RoutedExperts(ids=ids, num_experts=message.num_experts)


_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _config_num_experts(config: dict) -> int:
    config = config.get("text_config", config)
    return max(int(config.get(key) or 0) for key in _EXPERT_KEYS)


def checkpoint_num_experts(model_path: str | Path) -> int:
    """Experts per MoE layer that a checkpoint's config.json describes (0 for a dense model or no config)."""
    return _config_num_experts(checkpoint_config(model_path))


def find_routers(model) -> list[tuple[torch.nn.Module, bool]]:
    """The model's routers in layer order, each with whether it always renormalises its top-k gates.

    Empty for a dense model; UnsupportedRouter for a MoE model whose router rule is not a softmax top-k.
    """
    routers = []
    for module in model.modules():
        name = type(module).__name__
        if name in _SOFTMAX_TOPK_ROUTERS:
            routers.append((module, _SOFTMAX_TOPK_ROUTERS[name]))
        elif "router" in name.lower() and hasattr(module, "top_k"):
            raise UnsupportedRouter(
                f"{name}: routing replay supports the softmax top-k routers {sorted(_SOFTMAX_TOPK_ROUTERS)}"
            )
    config = getattr(model, "config", None)
    if not routers and config is not None and _config_num_experts(config.to_dict()) > 0:
        raise UnsupportedRouter(f"{type(model).__name__} is a MoE model but none of its modules is a known router")
    return routers


def routing_shape(model) -> RoutingShape | None:
    """The routing shape of a MoE model; None for a dense one."""
    routers = find_routers(model)
    if not routers:
        return None
    first = routers[0][0]
    return RoutingShape(num_layers=len(routers), top_k=int(first.top_k), num_experts=int(first.num_experts))


class RouterHooks:
    """Capture and forced routing on every router of one model (installed once, passive by default).

    The state is per model, not per thread: callers serialise forwards (the engine's weight lock, the learner's
    single loop), and a forced routing stays in force until its context exits, so a recomputing backward
    (activation checkpointing) inside the context sees the same experts.
    """

    def __init__(self, model):
        routers = find_routers(model)
        if not routers:
            raise ValueError("the model has no MoE routers")
        self.shape = routing_shape(model)
        self._captured: list[torch.Tensor | None] | None = None
        self._forced: torch.Tensor | None = None
        self._forced_mask: torch.Tensor | None = None
        self._handles = [
            router.register_forward_hook(partial(self._hook, layer, renormalise))
            for layer, (router, renormalise) in enumerate(routers)
        ]

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[torch.Tensor | None]]:
        """Record the experts each router chose on its own (before any forcing) during the forwards inside:
        the yielded list holds, per layer, the ids [tokens, top_k] of the last forward."""
        captured: list[torch.Tensor | None] = [None] * self.shape.num_layers
        self._captured = captured
        try:
            yield captured
        finally:
            self._captured = None

    @contextlib.contextmanager
    def force(self, expert_ids: torch.Tensor, mask: torch.Tensor | None = None) -> Iterator[None]:
        """Route the forwards inside with `expert_ids` [batch, seq, layers, top_k] (aligned with the forward's
        input_ids); positions where `mask` [batch, seq] is False route on their own."""
        if expert_ids.dim() != 4 or tuple(expert_ids.shape[2:]) != (self.shape.num_layers, self.shape.top_k):
            raise ValueError(
                f"forced expert ids must be [batch, seq, {self.shape.num_layers}, {self.shape.top_k}], "
                f"got {tuple(expert_ids.shape)}"
            )
        tokens = expert_ids.shape[0] * expert_ids.shape[1]
        self._forced = expert_ids.reshape(tokens, self.shape.num_layers, self.shape.top_k).long()
        self._forced_mask = None if mask is None else mask.reshape(tokens, 1).bool()
        try:
            yield
        finally:
            self._forced = self._forced_mask = None

    def _hook(self, layer: int, renormalise: bool, module, inputs, output):
        logits, gates, chosen = output
        if self._captured is not None:
            self._captured[layer] = chosen.detach()
        if self._forced is None:
            return None
        forced = self._forced[:, layer].to(chosen.device)
        if forced.shape != chosen.shape:
            raise RuntimeError(
                f"forced routing covers {forced.shape[0]} tokens, the forward routes {chosen.shape[0]}: the forced ids "
                "must be aligned with the padded input ids"
            )
        if self._forced_mask is not None:
            forced = torch.where(self._forced_mask.to(chosen.device), forced, chosen)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights = probs.gather(-1, forced)
        if renormalise or getattr(module, "norm_topk_prob", False):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(gates.dtype), forced

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def install_hooks(model) -> RouterHooks | None:
    """RouterHooks for a MoE model, None for a dense one."""
    return RouterHooks(model) if find_routers(model) else None


def routing_mismatch(learner_ids: torch.Tensor, rollout_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per layer, the fraction of `mask`ed tokens whose expert set differs: ids [..., layers, top_k], mask [...]."""
    same = (learner_ids.sort(dim=-1).values == rollout_ids.long().sort(dim=-1).values).all(dim=-1)
    valid = mask.bool().unsqueeze(-1).expand_as(same)
    return ((~same) & valid).sum(dim=tuple(range(same.dim() - 1))).float() / valid[..., 0].sum().clamp_min(1)
