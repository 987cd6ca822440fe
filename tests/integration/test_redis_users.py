"""One Redis user per role on a real redis-server, as `asyncrl up` starts it: each role's own code does its job
under its user (a replica appends and counts, the learner reads and acks, the controller keeps its state and
reads the counters), and the password a replica holds can do nothing else: not read the controller's keys,
not rewrite its state, not read or delete the stream, not flush the store."""

from __future__ import annotations

import pytest
import redis

from asyncrl.core.buffer import make_buffer
from asyncrl.core.buffer.lease_writes import LeaseWriteCounts
from asyncrl.core.buffer.redis_connection import redis_client
from asyncrl.core.buffer.redis_users import ROLES, acl_line, role_password, user_name
from asyncrl.core.config.schema import BufferConfig
from asyncrl.tools.processes import ProcessGroup
from asyncrl.tools.redis_local import start_local_redis
from asyncrl.v1 import trajectory_pb2
from tests.integration.test_controller_restart import redis_config, start, stop

pytestmark = pytest.mark.integration
ADMIN = "the run's admin password"
STATE_KEY = "asyncrl:controller"


@pytest.fixture(scope="module")
def users_redis(tmp_path_factory):
    group = ProcessGroup(tmp_path_factory.mktemp("redis-users-logs"))
    users = [acl_line(role, role_password(ADMIN, role), BufferConfig(), STATE_KEY) for role in ROLES]
    url = start_local_redis(group, tmp_path_factory.mktemp("redis-users"), password=ADMIN, users=users)
    yield url
    group.stop_all()


@pytest.fixture
def as_role(users_redis, monkeypatch):
    """Log this process's clients in as `role`'s user (what `up` puts in each role's environment)."""
    redis.Redis.from_url(users_redis, password=ADMIN).flushall()

    def login(role: str) -> BufferConfig:
        monkeypatch.setenv("ASYNCRL_REDIS_USER", user_name(role))
        monkeypatch.setenv("ASYNCRL_REDIS_PASSWORD", role_password(ADMIN, role))
        return BufferConfig(redis_url=users_redis, retry_s=0)

    return login


def group(i: int, lease_id: str = "") -> trajectory_pb2.TrajectoryGroup:
    return trajectory_pb2.TrajectoryGroup(group_id=f"g{i}", lease_id=lease_id, trajectories=[
        trajectory_pb2.Trajectory(trajectory_id=f"g{i}/{j}", group_id=f"g{i}") for j in range(2)])


def test_each_role_does_its_job_under_its_own_user(as_role, users_redis, tmp_path):
    learner = make_buffer(as_role("learner"), consumer="learner-0")  # creates the consumer group
    replica = make_buffer(as_role("rollout"), reads=False)
    written = replica.put_many([group(0, "lease-a"), group(1, "lease-a")])
    assert all(isinstance(entry_id, str) for entry_id in written), written
    replica.put_dead_letter(b"not a group", "poisoned")

    as_role("learner")
    entries = learner.get(10, 1.0)
    assert [e.group.group_id for e in entries] == ["g0", "g1"]
    learner.dead_letter(entries[1].entry_id, "refused")
    assert learner.ack([entries[0].entry_id]) == 1
    assert (learner.pending(), learner.backlog(), learner.entry_ids()) == (0, 0, [])
    assert [d.reason for d in learner.dead_letters()] == ["poisoned", "refused"]

    counts = LeaseWriteCounts(redis_client(as_role("controller")), "asyncrl:trajectories")
    assert counts.counts(["lease-a", "lease-b"]) == [4, 0]
    counts.forget(["lease-a"])
    assert counts.counts(["lease-a"]) == [0]
    server, _port = start(redis_config(users_redis, tmp_path))  # loads and saves its state under its user
    stop(server)
    assert redis.Redis.from_url(users_redis, password=ADMIN).hgetall(f"{STATE_KEY}:meta")


def refused(client: redis.Redis, command: str, *args) -> bool:
    try:
        client.execute_command(command, *args)
    except redis.exceptions.NoPermissionError:
        return True
    return False


# (command, arguments) a replica's or the learner's password must not run.
ATTACKS = [
    ("HGETALL", f"{STATE_KEY}:meta"), ("HGET", f"{STATE_KEY}:meta", "learner_key"), ("HVALS", f"{STATE_KEY}:replicas"),
    ("HSET", f"{STATE_KEY}:meta", "current_version", "0"), ("DEL", f"{STATE_KEY}:meta"), ("FLUSHALL",),
    ("FLUSHDB",), ("KEYS", "*"), ("SCAN", "0"), ("CONFIG", "GET", "*"), ("ACL", "LIST"), ("SET", "x", "1"),
    ("SHUTDOWN",), ("EVAL", "return 1", "0"), ("MONITOR",),
]
REPLICA_ONLY = [
    ("XREADGROUP", "GROUP", "learner", "thief", "STREAMS", "asyncrl:trajectories", ">"),
    ("XRANGE", "asyncrl:trajectories", "-", "+"), ("XDEL", "asyncrl:trajectories", "1-0"),
    ("XTRIM", "asyncrl:trajectories", "MAXLEN", "0"), ("DEL", "asyncrl:trajectories"),
    ("XGROUP", "DESTROY", "asyncrl:trajectories", "learner"), ("GET", "asyncrl:trajectories:written:lease-a"),
]


@pytest.mark.parametrize("role, attacks", [("rollout", ATTACKS + REPLICA_ONLY), ("learner", ATTACKS)])
def test_a_roles_password_does_nothing_else(as_role, users_redis, role, attacks):
    redis.Redis.from_url(users_redis, password=ADMIN).hset(f"{STATE_KEY}:meta", "learner_key", "secret")
    as_role(role)
    client = redis.Redis.from_url(users_redis, username=user_name(role), password=role_password(ADMIN, role))
    allowed = [" ".join(map(str, attack)) for attack in attacks if not refused(client, *attack)]
    assert allowed == []
    assert redis.Redis.from_url(users_redis, password=ADMIN).hget(f"{STATE_KEY}:meta", "learner_key") == b"secret"


def test_a_roles_password_is_not_anothers(users_redis):
    for role in ROLES:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(users_redis, username=user_name(role), password=ADMIN).ping()
        for other in set(ROLES) - {role}:
            with pytest.raises(redis.AuthenticationError):
                redis.Redis.from_url(users_redis, username=user_name(role),
                                     password=role_password(ADMIN, other)).ping()
