"""Serving an adapter merged into the base weights (the torch engine).

Merged, because the torch engine's decode loop is bound by kernel launches: an unmerged adapter adds two thin
matmuls per targeted module and token, a merged one nothing. A push costs one fused W + s B A per module
(`addmm`), computed off the generation lock into a spare set of tensors, which then replace the live ones by a
pointer swap (as a full push's buffers do); the replaced ones are the next push's spares, so a push allocates
nothing (fresh gigabytes per push cost more in page faults than the arithmetic). The base weights of the
targeted modules are kept (one copy) so every version merges onto the base, never onto the previous merge: no
drift across pushes.
"""

from __future__ import annotations

import torch

from asyncrl.core.lora.merge import merged_weight
from asyncrl.core.lora.spec import AdapterLayer, match_adapter
from asyncrl.core.wire.push_contract import PushOrder


class MergedAdapter:
    def __init__(self, slots: dict[str, torch.Tensor]):
        self._slots = slots
        """The model's weight objects by state-dict name (`modeling.weight_slots`)."""
        self._base: dict[str, torch.Tensor] = {}
        """Base weights of the modules an adapter targeted, copied at the first push that targets them."""
        self.checksum = ""
        """The checksum of the adapter merged in now ("" before the first)."""
        self._spare: dict[str, torch.Tensor] = {}
        """Per targeted weight, a tensor generation does not read (the one the last swap replaced)."""
        self._checked: tuple = ((), None, [])
        """(tensors, adapter, layers) of the last plan checked: every push of a run has the same, checked once."""

    def layers(self, plan: PushOrder) -> list[AdapterLayer]:
        """The plan's adapter checked against the model (ValueError naming the tensor)."""
        tensors, adapter, layers = self._checked
        if (tensors, adapter) != (plan.tensors, plan.adapter):
            shapes = {name: tuple(t.shape) for name, t in self._slots.items()}
            layers = match_adapter(plan.tensors, plan.adapter, shapes, where=f"adapter push {plan.push_id}")
            self._checked = (plan.tensors, plan.adapter, layers)
        return layers

    @torch.no_grad()
    def merge(self, plan: PushOrder, layers: list[AdapterLayer], received: dict[str, torch.Tensor]) -> dict:
        """Weight name -> its new merged tensor (nothing live is touched)."""
        merged = {}
        for layer in layers:
            base = self._base.get(layer.weight_name)
            if base is None:
                base = self._base[layer.weight_name] = self._slots[layer.weight_name].detach().clone()
            lora_a, lora_b = received[layer.a_name], received[layer.b_name]
            if base.dtype == torch.float32 and lora_a.dtype == lora_b.dtype == torch.float32:
                out = self._spare.pop(layer.weight_name, None)
                if out is None or out.shape != base.shape:
                    out = torch.empty_like(base)
                merged[layer.weight_name] = torch.addmm(base, lora_b.to(base.device), lora_a.to(base.device),
                                                        alpha=plan.adapter.scale, out=out)
            else:  # a low-precision base: merged in float32, then cast
                merged[layer.weight_name] = merged_weight(base, lora_a, lora_b, plan.adapter.scale)
        return merged

    def reset(self) -> None:
        """Full weights replaced the model's (a full push): they are the base of any adapter from now on."""
        self._base.clear()
        self._spare.clear()
        self.checksum = ""

    @torch.no_grad()
    def swap_in(self, merged: dict[str, torch.Tensor], checksum: str) -> None:
        """Point the live weights at `merged` (caller holds the engine's weight lock)."""
        for name, tensor in merged.items():
            self._spare[name] = self._slots[name].data
            self._slots[name].data = tensor
        self.checksum = checksum
