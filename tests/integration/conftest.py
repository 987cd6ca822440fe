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


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """All four services in this process on free ports, as their `create_server` builds them: name -> port."""
    from asyncrl.services import controller_service, learner_service, rollout_service, teacher_service
    from tests.integration.test_services import local_config

    config = local_config(tiny_model_dir)
    config.controller.port = 0
    started = {
        "controller": controller_service.create_server(config, run_dir=str(tmp_path_factory.mktemp("ctl"))),
        "rollout": rollout_service.create_server(config),
        "teacher": teacher_service.create_server(config),
        "learner": learner_service.create_server(config),
    }
    for server, _port in started.values():
        server.start()
    yield {name: port for name, (_server, port) in started.items()}
    for server, _port in started.values():
        server.stop(0).wait()
