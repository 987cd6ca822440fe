"""Applying an adapter to a base weight: W' = W + scale * B A, computed in float32 and stored in W's dtype. The
torch engine serves merged weights (no per-token cost in its decode loop) and the learner's Hugging Face export
writes them."""

from __future__ import annotations

import torch


@torch.no_grad()
def merged_weight(base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """A new tensor: `base` + scale * lora_b @ lora_a (base is left as it is)."""
    delta = lora_b.to(base.device, torch.float32) @ lora_a.to(base.device, torch.float32)
    return (base.float() + scale * delta).to(base.dtype)
