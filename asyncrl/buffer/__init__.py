"""Trajectory buffer: Redis Streams (deployments) or in-memory (unit tests), chosen by `BufferConfig.type`."""

from asyncrl.buffer.base import BufferEntry, TrajectoryBuffer, make_buffer

__all__ = ["BufferEntry", "TrajectoryBuffer", "make_buffer"]
