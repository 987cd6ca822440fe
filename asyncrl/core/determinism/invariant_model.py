"""Put a Hugging Face causal LM on the batch-invariant computations of `invariant_ops`.

`use_invariant_kernels(model)` registers an attention implementation built on `invariant_attention` and runs the
base model's and the vocabulary projection's forwards under a dispatch mode that routes every GEMM (the
linear layers, MoE experts and router included) and the activations through the invariant ops. Every forward
of the model is then batch invariant, whoever calls it: the torch engine's prefill and decode, the learner's
forwards, the teacher's scoring. Backward passes run outside the mode, on torch's usual kernels (the
gradient of the invariant forward, to float rounding).
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asyncrl.core.determinism.invariant_ops import (
    invariant_attention,
    invariant_mm,
    invariant_sigmoid,
    invariant_silu,
)

ATTENTION = "asyncrl_invariant"
"""The attention implementation's name in transformers' registry."""

SUPPORTED_ACTIVATIONS = frozenset({"silu", "swish"})

aten = torch.ops.aten


def _addmm(bias, a, b, *, beta=1, alpha=1):
    out = invariant_mm(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out
    return out + (bias if beta == 1 else bias * beta)


def _bmm(a, b):
    if a.shape[-1] == 1:  # one product per output (rotary position angles): exact with any kernel
        return torch.bmm(a, b)
    return torch.stack([invariant_mm(a[i], b[i]) for i in range(a.shape[0])])


def _silu_(x):
    return x.copy_(invariant_silu(x))


_HANDLERS = {
    aten.mm.default: invariant_mm,
    aten.addmm.default: _addmm,
    aten.bmm.default: _bmm,
    aten.silu.default: invariant_silu,
    aten.silu_.default: _silu_,
    aten.sigmoid.default: invariant_sigmoid,
}

_REFUSED = frozenset({
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_attention_math.default,
    aten.scaled_dot_product_attention.default,
    aten._grouped_mm.default,
})


class InvariantKernels(TorchDispatchMode):
    """Within it, the operations above run batch invariant; any other runs as usual (those the model uses
    are invariant already: the parity tests hold the whole forward to it). `strict=False` lets torch's own
    attention kernels run (to measure what the rest costs)."""

    def __init__(self, strict: bool = True):
        super().__init__()
        self.strict = strict

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        if self.strict and func in _REFUSED:
            raise RuntimeError(f"{func} is not batch invariant: the model must use the {ATTENTION!r} attention")
        return func(*args, **kwargs)


def _attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: returns ([B, Lq, H, D], no weights)."""
    if dropout:
        raise ValueError("batch-invariant attention has no dropout (set the model's attention_dropout to 0)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = invariant_attention(query, key, value, attention_mask, scaling)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(ATTENTION, _attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, eager_mask)


def why_not_invariant(model) -> str | None:
    """Why `model` cannot run batch invariant (None: it can)."""
    config = model.config
    act = getattr(config, "hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        return f"its activation {act!r} (batch-invariant activations: {sorted(SUPPORTED_ACTIVATIONS)})"
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return f"attention_dropout {config.attention_dropout} (batch-invariant attention has none)"
    if not hasattr(model, "set_attn_implementation"):
        return "it is not a transformers PreTrainedModel"
    return None


def _under_mode(module: torch.nn.Module) -> None:
    original = module.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        with InvariantKernels():
            return original(*args, **kwargs)

    module.forward = forward


def use_invariant_kernels(model) -> None:
    """Make every forward of `model` batch invariant (idempotent). ValueError naming what the model has that
    cannot be (`why_not_invariant`)."""
    if getattr(model, "_asyncrl_invariant", False):
        return
    reason = why_not_invariant(model)
    if reason is not None:
        raise ValueError(f"model.determinism: this model cannot run batch invariant: {reason}")
    _register_attention()
    model.set_attn_implementation(ATTENTION)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        # MoE experts one by one through the linear layers (the grouped GEMM is not batch invariant).
        model.set_experts_implementation("eager")
    _under_mode(model.base_model)
    _under_mode(model.get_output_embeddings())
    model._asyncrl_invariant = True


def is_invariant(model) -> bool:
    return bool(getattr(model, "_asyncrl_invariant", False))
