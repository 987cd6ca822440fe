"""An adapter on disk in peft's format: `adapter_model.safetensors` and `adapter_config.json`, what
`PeftModel.from_pretrained` and vLLM's LoRA loader read. Written by the learner's checkpoints and by a vLLM
replica's worker for each adapter pushed to it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl.core.lora.spec import AdapterSpec

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def write_adapter(directory: Path, spec: AdapterSpec, named: list[tuple[str, torch.Tensor]],
                  base_model_path: str = "") -> None:  # fmt: skip
    """`named` (peft's saved names -> tensors) and `spec` in peft's format into `directory`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().to("cpu").contiguous() for name, t in named}, str(directory / ADAPTER_FILE),
              metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(spec.peft_config(base_model_path), indent=2))
