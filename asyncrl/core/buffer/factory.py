"""The buffer factory: the `TrajectoryBuffer` that `BufferConfig.type` names."""

from __future__ import annotations

from asyncrl.core.buffer.base import TrajectoryBuffer
from asyncrl.core.config.schema import BufferConfig


def make_buffer(cfg: BufferConfig, consumer: str = "learner-0", reads: bool = True) -> TrajectoryBuffer:
    """Factory: the buffer named by `cfg.type`; `reads` False for a writer that only appends (a replica)."""
    if cfg.type == "redis":
        from asyncrl.core.buffer.redis_buffer import RedisBuffer
        from asyncrl.core.buffer.redis_connection import redis_client

        return RedisBuffer(redis_client(cfg), cfg.stream, cfg.consumer_group, consumer, cfg.delete_after_ack,
                           dead_letter_stream=cfg.dead_letter_stream, reads=reads)
    if cfg.type == "memory":
        from asyncrl.core.buffer.memory import MemoryBuffer

        return MemoryBuffer()
    raise ValueError(f"unknown buffer type {cfg.type!r} (expected 'redis' or 'memory')")
