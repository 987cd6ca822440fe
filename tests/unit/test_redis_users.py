"""The Redis users of the roles (`asyncrl.core.buffer.redis_users`) and what `up` tells each role
(`asyncrl.tools.run_secrets.redis_role_env`), against hand-written values."""

import hashlib

from asyncrl.core.buffer.redis_users import acl_line, role_password, rules
from asyncrl.core.config.schema import AsyncRLConfig, BufferConfig
from asyncrl.tools.run_secrets import redis_role_env

BASE = "resetchannels -@all +ping +multi +exec +discard"


def test_each_role_gets_its_keys_and_commands():
    buffer = BufferConfig(stream="s", dead_letter_stream="dead")
    assert rules("rollout", buffer, "ctl") == f"resetkeys ~s ~s:written:* ~dead {BASE} +xadd +incrby +expire"
    assert rules("learner", buffer, "ctl") == f"resetkeys ~s ~dead {BASE} +@stream"
    assert rules("controller", buffer, "ctl") == f"resetkeys ~ctl:* ~s:written:* {BASE} +@hash +mget +del"


def test_a_users_line_holds_the_hash_of_its_password_not_the_password():
    line = acl_line("rollout", "pw", BufferConfig(), "ctl")
    assert line.startswith(f"user asyncrl-rollout reset on #{hashlib.sha256(b'pw').hexdigest()} resetkeys")
    assert " >" not in line and "pw " not in line


def test_role_passwords_are_derived_apart():
    passwords = {role: role_password("admin", role) for role in ("controller", "learner", "rollout")}
    assert len(set(passwords.values())) == 3 and "admin" not in "".join(passwords.values())
    assert passwords["rollout"] == role_password("admin", "rollout") != role_password("other", "rollout")


def test_up_gives_each_role_its_own_user_and_the_others_none(tmp_path, monkeypatch):
    cfg = AsyncRLConfig(run_dir=str(tmp_path))
    monkeypatch.setenv("ASYNCRL_REDIS_PASSWORD", "admin")
    assert redis_role_env(cfg, "rollout") == {}  # a Redis the user runs: the configured credentials, as they are
    (tmp_path / "redis").mkdir()
    assert redis_role_env(cfg, "rollout") == {"ASYNCRL_REDIS_USER": "asyncrl-rollout",
                                              "ASYNCRL_REDIS_PASSWORD": role_password("admin", "rollout")}
    assert redis_role_env(cfg, "teacher") == {"ASYNCRL_REDIS_USER": "", "ASYNCRL_REDIS_PASSWORD": ""}
