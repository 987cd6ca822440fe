"""Integration fixtures: a real redis-server per test session (Debian package, started by the tests)."""

from __future__ import annotations

import pytest
import redis

from asyncrl.tools.processes import ProcessGroup
from asyncrl.tools.redis_local import start_local_redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """URL of a fresh local redis-server (no persistence), stopped at the end of the session."""
    group = ProcessGroup(tmp_path_factory.mktemp("redis-logs"))
    url = start_local_redis(group, tmp_path_factory.mktemp("redis-data"))
    yield url
    group.stop_all()


@pytest.fixture
def clean_redis(redis_url):
    """The session's Redis, emptied before the test."""
    redis.Redis.from_url(redis_url).flushall()
    return redis_url
