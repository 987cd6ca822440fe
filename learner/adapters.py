"""The learner's LoRA adapters (`learner.lora`), with peft: injected into the policy in place (the model object
stays the transformers model every forward here calls; its targeted linear layers become peft's LoRA layers),
the base frozen, only the adapters trained, pushed and checkpointed.

- The KL reference is the base policy itself: the same model with its adapters switched off (`disabled`), no
  copy. (The run starts with B = 0, so the base is the policy the run started from, as a full run's reference.)
- A push carries the adapter tensors only, under peft's saved names (`lora_parameters`).
- A checkpoint holds the adapter in peft's format (`save_adapter`) and the merged policy as a plain Hugging
  Face checkpoint (`merged_state_dict`).
- Several runs may share one base: each run's adapter is injected under the run's name (peft's adapter name),
  with its own rank and targets, and `run_active` makes one run's adapter the one every forward uses (and the
  only one with gradients) for the duration of that run's step.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.learner import LoraConfig
from asyncrl.core.lora.files import write_adapter
from asyncrl.core.lora.merge import merged_weight
from asyncrl.core.lora.spec import AdapterSpec, adapter_name

DEFAULT_RUN = "default"
"""The adapter name of a deployment's only run (peft's default name)."""


def inject_adapters(model: torch.nn.Module, cfg: LoraConfig, run: str = DEFAULT_RUN) -> AdapterSpec:
    """Put LoRA adapters of `cfg` (`learner.lora`) into `model` in place (peft) under the adapter name `run`,
    freeze everything else; returns the adapter's shape. ConfigError when a target module matches nothing or is
    tied to the embeddings. A second run's adapter joins the first's on the same base (`run_active` picks)."""
    from peft import LoraConfig, inject_adapter_in_model

    spec = AdapterSpec(cfg.rank, float(cfg.alpha), tuple(cfg.target_modules))
    modules = dict(model.named_modules())
    for target in spec.target_modules:
        matched = {n: m for n, m in modules.items() if n == target or n.endswith("." + target)}
        if not matched:
            raise ConfigError(f"learner.lora.target_modules: no module of the model is named {target!r}")
        # Receivers merge and check W (out, in) + B A: a Conv1D (GPT-2's c_attn) stores its weight transposed.
        for name, module in matched.items():
            module = getattr(module, "base_layer", module)  # another run's adapter is on it already
            if type(module) is not torch.nn.Linear:
                raise ConfigError(f"learner.lora.target_modules: {target!r} matches {name}, a "
                                  f"{type(module).__name__}; adapters go on torch.nn.Linear modules only")
    peft_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=list(cfg.target_modules), bias="none")
    if any(run in layer.lora_A for layer in lora_layers(model)):
        raise ValueError(f"the model already holds an adapter named {run!r}")
    model.requires_grad_(False)
    with warnings.catch_warnings():  # peft warns at a second adapter on one model: here that is the point
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        inject_adapter_in_model(peft_cfg, model, adapter_name=run)
    activate_run(model, run)
    return spec


def lora_parameters(model: torch.nn.Module, run: str = DEFAULT_RUN) -> list[tuple[str, torch.nn.Parameter]]:
    """Run `run`'s adapter parameters under peft's saved names (`base_model.model.<module>.lora_A.weight`), in
    module order: what a push carries and a checkpoint's adapter holds."""
    out = []
    for name, param in model.named_parameters():
        for part in ("A", "B"):
            marker = f".lora_{part}.{run}.weight"
            if name.endswith(marker):
                out.append((adapter_name(name[: -len(marker)], part), param))
    return out


def lora_layers(model: torch.nn.Module) -> list:
    """peft's LoRA layers of `model`, in module order (a walk over every module: keep it while no adapter is
    added or dropped)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def activate_run(model: torch.nn.Module, run: str, layers: list | None = None) -> None:
    """From now on every forward and backward uses run `run`'s adapter (a module it does not target: the base),
    and only its parameters get gradients (peft's `set_adapter`). `layers`: `lora_layers(model)`, when the
    caller keeps them. ValueError when the model holds no adapter by that name."""
    layers = lora_layers(model) if layers is None else layers
    runs = {name for layer in layers for name in layer.lora_A}
    if run not in runs:
        raise ValueError(f"the model holds no adapter named {run!r} (it holds {sorted(runs)})")
    for layer in layers:
        layer.set_adapter(run)  # the active adapter trainable, the others frozen


def reset_adapter(model: torch.nn.Module, run: str) -> None:
    """Run `run`'s adapter as a fresh one starts: B = 0 (the policy is the base again), A drawn anew (peft's
    initialisation)."""
    layers = [layer for layer in lora_layers(model) if run in layer.lora_A]
    if not layers:
        raise ValueError(f"the model holds no adapter named {run!r}")
    with torch.no_grad():
        for layer in layers:
            layer.reset_lora_parameters(run, True)


@contextlib.contextmanager
def run_active(model: torch.nn.Module, run: str):
    """Inside, run `run`'s adapter is active (`activate_run`); the run active before is active again afterwards."""
    layers = lora_layers(model)
    before = layers[0].active_adapters[0] if layers else None
    activate_run(model, run, layers)
    try:
        yield
    finally:
        activate_run(model, before, layers)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """The base policy for the duration (the KL reference): every LoRA layer skips its adapter."""
    layers = lora_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def save_adapter(directory: Path, spec: AdapterSpec, named: list[tuple[str, torch.Tensor]],
                 base_model_path: str = "") -> str:  # fmt: skip
    """The adapter in peft's format into `directory` (`asyncrl.core.lora.files`), its checksum written beside
    it; returns the checksum."""
    write_adapter(directory, spec, named, base_model_path)
    checksum = weights_checksum(named)
    (directory / "checksum.txt").write_text(checksum + "\n")
    return checksum


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, spec: AdapterSpec,
                      adapter: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The policy as a plain transformers state dict: the base weights under their own names with every targeted
    weight merged (W + scale B A), host copies. `adapter`: peft saved name -> tensor (a staged copy; None: the
    model's live adapter)."""
    adapter = dict(lora_parameters(model)) if adapter is None else adapter
    state = {}
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        module = plain.removesuffix(".weight")
        a_name = adapter_name(module, "A")
        if plain.endswith(".weight") and a_name in adapter:
            tensor = merged_weight(tensor, adapter[a_name], adapter[adapter_name(module, "B")], spec.scale)
        state[plain] = tensor.detach().to("cpu", copy=True).contiguous()
    return state
