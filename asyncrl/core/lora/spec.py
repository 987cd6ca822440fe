"""What a LoRA adapter push is: its shape (`AdapterSpec`: rank, alpha, target modules, with its proto form) and
the tensors it carries, named as peft saves them (`base_model.model.<module>.lora_A.weight`, `...lora_B.weight`).

Torch-free on purpose: the controller decodes plans that carry a spec and never needs torch otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from asyncrl.core.checks.validation import require, shown
from asyncrl.v1 import weights_pb2

PEFT_PREFIX = "base_model.model."
"""What peft's saved names put before the model's own module path."""
LORA_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B"}
MAX_RANK = 4096
MAX_TARGETS = 256
UNTARGETABLE = ("lm_head", "embed_tokens")
"""Modules an adapter may not target: a tied output projection shares its weight with the input embedding, and a
merged update there would move both."""


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter's shape: W' = W + (alpha / rank) B A on each module whose name ends with a target."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_proto(self) -> weights_pb2.AdapterSpec:
        return weights_pb2.AdapterSpec(rank=self.rank, alpha=self.alpha, target_modules=list(self.target_modules))

    @classmethod
    def from_proto(cls, msg: weights_pb2.AdapterSpec, field: str) -> AdapterSpec | None:
        """The spec in `msg` (None when it is unset: rank 0), every field checked (InvalidArgument naming it)."""
        if msg.rank == 0 and not msg.target_modules and msg.alpha == 0:
            return None
        require(1 <= msg.rank <= MAX_RANK, f"{field}.rank", f"must be in [1, {MAX_RANK}], got {msg.rank}")
        require(math.isfinite(msg.alpha) and msg.alpha > 0, f"{field}.alpha", f"must be finite and > 0, got {msg.alpha}")
        require(1 <= len(msg.target_modules) <= MAX_TARGETS, f"{field}.target_modules",
                f"must name 1 to {MAX_TARGETS} modules, got {len(msg.target_modules)}")
        for i, name in enumerate(msg.target_modules):
            require(0 < len(name) <= 200 and name.replace("_", "").replace(".", "").isalnum(),
                    f"{field}.target_modules[{i}]", f"must be a module name, got {shown(name)}")
            require(name.rsplit(".", 1)[-1] not in UNTARGETABLE, f"{field}.target_modules[{i}]",
                    f"{name!r} cannot carry an adapter (embeddings and the output projection are not targeted)")
        return cls(msg.rank, float(msg.alpha), tuple(msg.target_modules))

    def peft_config(self, base_model_path: str = "") -> dict:
        """The `adapter_config.json` peft and vLLM read for this adapter."""
        return {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
            "target_modules": list(self.target_modules), "lora_dropout": 0.0, "bias": "none",
            "base_model_name_or_path": base_model_path, "fan_in_fan_out": False, "use_rslora": False,
            "modules_to_save": None, "init_lora_weights": True,
        }  # fmt: skip


def parse_adapter_name(name: str) -> tuple[str, str]:
    """peft's saved name -> (the model's module path, "A" or "B"); ValueError for any other name."""
    for suffix, part in LORA_SUFFIXES.items():
        if name.startswith(PEFT_PREFIX) and name.endswith(suffix):
            module = name[len(PEFT_PREFIX) : -len(suffix)]
            if module:
                return module, part
    raise ValueError(f"adapter tensor {name!r} is not named as peft saves a LoRA weight "
                     f"({PEFT_PREFIX}<module>.lora_A.weight or .lora_B.weight)")


def adapter_name(module: str, part: str) -> str:
    return f"{PEFT_PREFIX}{module}.lora_{part}.weight"


def targets(module: str, spec: AdapterSpec) -> bool:
    """Whether `module` (a module path) is one the spec targets (peft's rule: its name ends with a target)."""
    return any(module == t or module.endswith("." + t) for t in spec.target_modules)


@dataclass(frozen=True)
class AdapterLayer:
    """One targeted module of an adapter push: where its A and B sit in the push, and the weight it updates."""

    module: str
    a_name: str
    b_name: str
    weight_name: str


def match_adapter(metas: Iterable, spec: AdapterSpec, weight_shapes: Mapping[str, tuple[int, ...]],
                  where: str = "adapter push") -> list[AdapterLayer]:
    """Hold an adapter push's tensors (`TensorMeta`s) against the base model (`weight_shapes`: state-dict name ->
    shape): every tensor an A or B of a targeted module the model has, both of each module present, A of shape
    (rank, in) and B (out, rank) for the module's (out, in) weight. Raises ValueError naming the tensor."""
    parts: dict[str, dict[str, object]] = {}
    for meta in metas:
        module, part = parse_adapter_name(meta.name)
        weight = f"{module}.weight"
        if weight not in weight_shapes or len(weight_shapes[weight]) != 2:
            raise ValueError(f"{where}: tensor {meta.name!r}: the model has no linear module {module!r}")
        if not targets(module, spec):
            raise ValueError(f"{where}: tensor {meta.name!r}: module {module!r} is not among the adapter's "
                             f"target_modules {list(spec.target_modules)}")
        out_dim, in_dim = weight_shapes[weight]
        expected = (spec.rank, in_dim) if part == "A" else (out_dim, spec.rank)
        if tuple(meta.shape) != expected:
            raise ValueError(f"{where}: tensor {meta.name!r} has shape {tuple(meta.shape)}, rank {spec.rank} on "
                             f"{module!r} needs {expected}")
        if part in parts.setdefault(module, {}):
            raise ValueError(f"{where}: tensor {meta.name!r} is listed twice")
        parts[module][part] = meta
    if not parts:
        raise ValueError(f"{where}: carries no adapter tensors")
    layers = []
    for module, found in parts.items():
        if set(found) != {"A", "B"}:
            lacking = "B" if "A" in found else "A"
            raise ValueError(f"{where}: module {module!r} has lora_{next(iter(found))} but no lora_{lacking}")
        layers.append(AdapterLayer(module, adapter_name(module, "A"), adapter_name(module, "B"), f"{module}.weight"))
    return layers
