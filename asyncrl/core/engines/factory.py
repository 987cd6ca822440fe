"""The engine factory: the `Engine` that `EngineConfig.type` names (torch or vllm)."""

from __future__ import annotations

from asyncrl.core.engines.base import Engine


def make_engine(engine_cfg, model_path: str, dtype: str, seed: int = 0, version: int = 0) -> Engine:
    """Factory: the engine named by `engine_cfg.type`."""
    if engine_cfg.type == "torch":
        from asyncrl.core.engines.torch_engine import TorchEngine

        return TorchEngine(engine_cfg, model_path, dtype, seed=seed, version=version)
    if engine_cfg.type == "vllm":
        from asyncrl.core.engines.vllm_engine import VLLMEngine

        return VLLMEngine(engine_cfg, model_path, dtype, seed=seed, version=version)
    raise ValueError(f"unknown engine type {engine_cfg.type!r} (expected 'torch' or 'vllm')")
