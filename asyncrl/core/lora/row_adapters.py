"""Several adapters in one batch, unmerged: each row of a forward goes through the adapter its slot holds.

One frozen base serves many runs' adapters at once (one model in memory, one batch on the cores). The bank
replaces each targeted `nn.Linear` with a `RowAdapterLinear` that keeps the base layer and a fixed number of
adapter slots, allocated up front as vLLM's `max_loras` x `max_lora_rank` is: loading an adapter copies into a
free slot, nothing is allocated while serving. Slot 0 is the base itself (no adapter).

A forward inside `bank.rows(slots)` gives row i the adapter of `slots[i]`:
    out_i = W x_i + (x_i A_s^T)(s B_s)^T, with the adapter's scale folded into B at load.
Rows are grouped by slot once per `rows` call (a decode batch's rows keep their slots for every step), so a
module costs two thin matmuls per distinct adapter in the batch, not one gather per row; rows of one adapter
that sit together (the decode loop orders a batch's rows by adapter) are views, their update added in place.
An adapter of a smaller rank than the slot uses only its own rank's rows of the slot.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from asyncrl.core.lora.spec import AdapterSpec, match_adapter, targets

BASE_SLOT = 0
"""The slot that holds no adapter: its rows get the base model's output exactly."""


@dataclass(frozen=True)
class _Meta:
    """What `match_adapter` reads of a tensor: its name and shape."""

    name: str
    shape: tuple[int, ...]


class RowAdapterLinear(torch.nn.Module):
    """A targeted linear layer with `slots` adapter slots beside its base (see the module's docstring)."""

    def __init__(self, base: torch.nn.Linear, bank: AdapterBank, slots: int, max_rank: int):
        super().__init__()
        self.base = base
        self.bank = bank
        weight = base.weight
        # Slot 0 stays zero: the base. Buffers, not parameters: serving never trains them.
        self.register_buffer("lora_a", torch.zeros(slots + 1, max_rank, base.in_features, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)
        self.register_buffer("lora_b", torch.zeros(slots + 1, base.out_features, max_rank, dtype=weight.dtype,
                                                   device=weight.device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        groups = self.bank.groups.get()
        if not groups:
            return out
        flat_x, flat_out = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        per_row = flat_x.shape[0] // x.shape[0]  # positions per batch row
        for slot, rows in groups:
            rank = self.bank.ranks[slot]
            a, b = self.lora_a[slot, :rank], self.lora_b[slot, :, :rank]
            if isinstance(rows, tuple):  # rows lo..hi: views, the update added in place (addmm_)
                lo, hi = rows[0] * per_row, rows[1] * per_row
                flat_out[lo:hi].addmm_(flat_x[lo:hi] @ a.T, b.T)
            else:
                picked = x.index_select(0, rows)
                out.index_add_(0, rows, (picked @ a.T) @ b.T)
        return out


class AdapterBank:
    """Adapter slots on every module of `model` a target names (peft's rule), put in place of its linear layers."""

    def __init__(self, model: torch.nn.Module, target_modules: Sequence[str], slots: int, max_rank: int):
        if slots < 1:
            raise ValueError(f"an adapter bank needs at least one slot, got {slots}")
        if max_rank < 1:
            raise ValueError(f"max_rank must be >= 1, got {max_rank}")
        self.slots, self.max_rank = slots, max_rank
        self.ranks = [0] * (slots + 1)
        """Per slot, the rank of the adapter it holds (0: empty)."""
        self.groups: contextvars.ContextVar[tuple[tuple[int, tuple[int, int] | torch.Tensor], ...]] = (
            contextvars.ContextVar(f"adapter_rows_{id(self)}", default=()))
        """The forward's (slot, rows) with an adapter, rows (lo, hi) when they are consecutive, else their
        indices: a context variable, so batches decoding in threads of their own (or tasks) each see theirs."""
        reach = AdapterSpec(1, 1.0, tuple(target_modules))
        self.layers: dict[str, RowAdapterLinear] = {}
        """Module path -> its layer with slots."""
        for name, module in list(model.named_modules()):
            if targets(name, reach) and type(module) is torch.nn.Linear:
                parent_name, _, attr = name.rpartition(".")
                parent = model.get_submodule(parent_name)
                layer = RowAdapterLinear(module, self, slots, max_rank)
                setattr(parent, attr, layer)
                self.layers[name] = layer
        if not self.layers:
            raise ValueError(f"no linear module of the model is named by {list(target_modules)}")

    @property
    def bytes(self) -> int:
        """What the slots hold in memory, all slots together."""
        return sum(t.numel() * t.element_size()
                   for layer in self.layers.values() for t in (layer.lora_a, layer.lora_b))

    @torch.no_grad()
    def load(self, slot: int, spec: AdapterSpec, tensors: Mapping[str, torch.Tensor], where: str = "adapter") -> None:
        """Copy an adapter (peft's saved names -> tensors) into `slot`, its scale folded into B; every module of
        the bank it does not carry gets zeros there. ValueError naming what does not fit; the slot is unchanged
        then. The caller keeps `slot` out of every running batch while it loads."""
        self._check_slot(slot)
        if spec.rank > self.max_rank:
            raise ValueError(f"{where}: rank {spec.rank} is above the bank's max_rank {self.max_rank}")
        shapes = {f"{name}.weight": (layer.base.out_features, layer.base.in_features)
                  for name, layer in self.layers.items()}
        metas = [_Meta(name, tuple(t.shape)) for name, t in tensors.items()]
        matched = match_adapter(metas, spec, shapes, where=where)
        for layer in self.layers.values():
            layer.lora_a[slot].zero_()
            layer.lora_b[slot].zero_()
        for m in matched:
            layer = self.layers[m.module]
            layer.lora_a[slot, : spec.rank].copy_(tensors[m.a_name])
            layer.lora_b[slot, :, : spec.rank].copy_(tensors[m.b_name] * spec.scale)
        self.ranks[slot] = spec.rank

    def clear(self, slot: int) -> None:
        """Empty `slot` (its rows would get the base)."""
        self._check_slot(slot)
        self.ranks[slot] = 0

    @contextlib.contextmanager
    def rows(self, slots: Sequence[int]) -> Iterator[None]:
        """Every forward inside gives row i the adapter in `slots[i]` (BASE_SLOT: none; an empty slot: none)."""
        for slot in set(slots):
            if slot != BASE_SLOT:
                self._check_slot(slot)
        device = next(iter(self.layers.values())).lora_a.device
        groups: list[tuple[int, tuple[int, int] | torch.Tensor]] = []
        for slot in sorted({s for s in slots if s != BASE_SLOT and self.ranks[s]}):
            rows = [i for i, t in enumerate(slots) if t == slot]
            if rows[-1] - rows[0] + 1 == len(rows):  # one run of rows (the decode loop sorts them so)
                groups.append((slot, (rows[0], rows[-1] + 1)))
            else:
                groups.append((slot, torch.tensor(rows, dtype=torch.long, device=device)))
        token = self.groups.set(tuple(groups))
        try:
            yield
        finally:
            self.groups.reset(token)

    def _check_slot(self, slot: int) -> None:
        if not 1 <= slot <= self.slots:
            raise ValueError(f"adapter slot {slot} is not in [1, {self.slots}]")
