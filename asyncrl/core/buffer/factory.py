"""The buffer factory: the `TrajectoryBuffer` that `BufferConfig.type` names."""

from __future__ import annotations

from asyncrl.core.buffer.base import TrajectoryBuffer


def make_buffer(cfg, consumer: str = "learner-0") -> TrajectoryBuffer:
    """Factory: the buffer named by `cfg.type`."""
    if cfg.type == "redis":
        from asyncrl.core.buffer.redis_buffer import RedisBuffer

        if not cfg.redis_url:
            raise ValueError("buffer.redis_url is empty: start Redis (or use `asyncrl up`, which does)")
        return RedisBuffer(cfg.redis_url, cfg.stream, cfg.consumer_group, consumer, cfg.delete_after_ack,
                           dead_letter_stream=cfg.dead_letter_stream, retry_s=cfg.retry_s)
    if cfg.type == "memory":
        from asyncrl.core.buffer.memory import MemoryBuffer

        return MemoryBuffer()
    raise ValueError(f"unknown buffer type {cfg.type!r} (expected 'redis' or 'memory')")
