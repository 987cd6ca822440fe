"""Trajectory buffer: Redis Streams (deployments) or in-memory (unit tests), chosen by `BufferConfig.type`."""

from asyncrl.core.buffer.base import BufferEntry, DeadLetter, TrajectoryBuffer
from asyncrl.core.buffer.factory import make_buffer

__all__ = ["BufferEntry", "DeadLetter", "TrajectoryBuffer", "make_buffer"]
