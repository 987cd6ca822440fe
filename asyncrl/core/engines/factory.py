"""The engine factories: the `Engine` that `EngineConfig.type` names (torch or vllm), and the model several LoRA
runs share in one replica."""

from __future__ import annotations

from asyncrl.core.engines.base import Engine
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.wire.push_contract import WeightSource


def make_engine(engine_cfg, model_path: str, dtype: str, seed: int = 0, version: int = 0,
                adapters: AdapterServing | None = None, determinism: str = "off",
                weights: WeightSource | None = None) -> Engine:  # fmt: skip
    """Factory: the engine named by `engine_cfg.type`; `adapters`: a LoRA run's (`AdapterServing.for_run`). The
    torch engine merges every adapter pushed to it and needs nothing set up; vLLM loads them as LoRA adapters.
    `determinism` (`model.determinism`): the torch engine runs batch invariant from reproducible on; vLLM
    has its own switch (`VLLM_BATCH_INVARIANT`, GPUs only: docs/determinism.md). `weights`: where pushes come
from (`asyncrl.push.receiving.BroadcastReceiving`); None for an engine that takes none (the teacher's)."""
    if engine_cfg.type == "torch":
        from asyncrl.core.engines.torch_engine import TorchEngine

        return TorchEngine(engine_cfg, model_path, dtype, seed=seed, version=version, determinism=determinism,
                           weights=weights)
    if engine_cfg.type == "vllm":
        from asyncrl.core.engines.vllm_engine import VLLMEngine

        return VLLMEngine(engine_cfg, model_path, dtype, seed=seed, version=version, adapters=adapters,
                          determinism=determinism, weights=weights)
    raise ValueError(f"unknown engine type {engine_cfg.type!r} (expected 'torch' or 'vllm')")


def make_shared_model(engine_cfg, model_path: str, dtype: str, shape, worker_extension: str, seed: int = 0):
    """Factory: the model a replica of a deployment of several LoRA runs serves every run from, by
    `engine_cfg.type`, holding what `shape` (`asyncrl.core.config.runs.BankShape`) says: the torch engine's
    adapter bank (`run_adapters.SharedTorchModel`) or one vLLM engine with LoRA slots for every run
    (`vllm_runs.SharedVLLMModel`, its worker receiving pushes with `worker_extension`). Either has `add_run`,
    `remove_run`, `engine_for(run, weights)` and `close`."""
    if engine_cfg.type == "torch":
        from asyncrl.core.engines.run_adapters import SharedTorchModel

        return SharedTorchModel(engine_cfg, model_path, dtype, shape.runs, shape.max_rank, shape.targets, seed=seed)
    if engine_cfg.type == "vllm":
        from asyncrl.core.engines.vllm_runs import SharedVLLMModel

        return SharedVLLMModel(engine_cfg, model_path, dtype, shape.runs, shape.max_rank, shape.versions_kept,
                               worker_extension, seed=seed)
    raise ValueError(f"unknown engine type {engine_cfg.type!r} (expected 'torch' or 'vllm')")
