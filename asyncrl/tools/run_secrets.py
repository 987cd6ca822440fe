"""The secrets `asyncrl up` makes for a run when none are configured: the gRPC access token, the learner secret
(`asyncrl.core.wire.learner_secret`) and the admin password of the redis-server it starts. Each is written
owner-only into the run directory (so a user's own clients, and `up --resume`, find it) and put into the
environment the run's processes inherit; of Redis, each role gets only its own user (`redis_role_env`)."""

from __future__ import annotations

import os
from pathlib import Path

from asyncrl.core.buffer.redis_connection import redis_password
from asyncrl.core.buffer.redis_users import ROLES, acl_line, role_password, user_name
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.wire.auth import Auth, MissingToken, new_token, resolve_auth
from asyncrl.core.wire.learner_secret import MissingLearnerSecret, resolve_learner_secret
from asyncrl.tools.redis_local import start_local_redis


def run_auth(cfg: AsyncRLConfig) -> Auth:
    """The run's credentials. With no token configured (and not `security.insecure`) `up` makes one for this
    run: `<run_dir>/token`, and the environment variable `security.token_env`."""
    try:
        return resolve_auth(cfg.security)
    except MissingToken:
        path = Path(cfg.run_dir) / "token"
        # `up --resume` keeps the token the run was started with: the user's clients still hold it.
        os.environ[cfg.security.token_env], made = _secret(path)
        print(f"[up] {'generated the' if made else 'using the'} run's access token: {path} "
              f"(env {cfg.security.token_env})", flush=True)
        return resolve_auth(cfg.security)


def run_learner_secret(cfg: AsyncRLConfig) -> None:
    """With no learner secret configured (and not `security.insecure`) `up` makes one for this run:
    `<run_dir>/learner-secret`, and the environment variable `security.learner_secret_env`. Its processes run as
    one user, so every one of them could read it; across hosts only the controller and the learner get it
    (deploy/)."""
    try:
        resolve_learner_secret(cfg.security)
    except MissingLearnerSecret:
        os.environ[cfg.security.learner_secret_env], _made = _secret(Path(cfg.run_dir) / "learner-secret")


def start_run_redis(group, cfg: AsyncRLConfig, host: str = "127.0.0.1", port: int = 0) -> str:
    """The redis-server of a run `up` starts (its URL): the run's admin password (`local_redis_password`) and
    one user per role (`asyncrl.core.buffer.redis_users`), whose passwords `redis_role_env` hands out."""
    users = redis_users(cfg, local_redis_password(cfg))
    return start_local_redis(group, Path(cfg.run_dir) / "redis", host=host, port=port,
                             password=local_redis_password(cfg), users=users)


def redis_users(cfg: AsyncRLConfig, admin: str) -> list[str]:
    """The `user` directives of a run's Redis: one user per role; with `runs:`, the learner's and the replicas'
    reach every run's keys (a removed run's too: its last records and its audit read them) and each run's
    controller has its own (`asyncrl.core.buffer.redis_users`)."""
    runs = run_configs(cfg, removed=True)
    if not runs:
        return [acl_line(role, role_password(admin, role), cfg.buffer, cfg.controller.state_key) for role in ROLES]
    scopes = [(run_cfg.buffer, run_cfg.controller.state_key) for run_cfg in runs.values()]
    users = [acl_line(role, role_password(admin, role), *scopes[0], *scopes[1:]) for role in ROLES
             if role != "controller"]
    return users + [acl_line("controller", role_password(admin, f"controller-{run}"), *scope, run=run)
                    for run, scope in zip(runs, scopes)]


def refresh_redis_users(cfg: AsyncRLConfig) -> None:
    """Set the users of the redis-server `up` started to `cfg`'s (runs added or removed while it lives); each
    user's change is one `ACL SETUSER`, atomic for the connections it already has."""
    if not (Path(cfg.run_dir) / "redis").is_dir():
        return  # a Redis the user runs: its users are the user's to manage
    import redis

    client = redis.Redis.from_url(cfg.buffer.redis_url, password=local_redis_password(cfg), username=None)
    try:
        for line in redis_users(cfg, local_redis_password(cfg)):
            client.execute_command("ACL", "SETUSER", *line.split()[1:])
    finally:
        client.close()


def redis_role_env(cfg: AsyncRLConfig, role: str, run: str = "") -> dict[str, str]:
    """What a process of `role` is told about the run's Redis when `up` runs it: its own user and password for
    the roles that use Redis (`run`: a run's controller in a deployment of several runs), nothing (not the admin password `up` holds) for the others. Empty for a Redis
    the user runs (`buffer.redis_url` given): the configured credentials then go to every role as they are."""
    if not (Path(cfg.run_dir) / "redis").is_dir():
        return {}
    if role not in ROLES:
        return {cfg.buffer.username_env: "", cfg.buffer.password_env: ""}
    return {cfg.buffer.username_env: user_name(role, run),
            cfg.buffer.password_env: role_password(local_redis_password(cfg), f"{role}-{run}" if run else role)}


def local_redis_password(cfg: AsyncRLConfig) -> str:
    """The password of the redis-server `up` starts: the configured one, else the run's own
    (`<run_dir>/redis-password`, made once; the environment variable `buffer.password_env`)."""
    configured = redis_password(cfg.buffer)
    if configured:
        return configured
    password, _made = _secret(Path(cfg.run_dir) / "redis-password")
    os.environ[cfg.buffer.password_env] = password
    return password


def _secret(path: Path) -> tuple[str, bool]:
    """The secret in `path`, made (owner-only) when the file does not exist yet; and whether it was made."""
    existing = path.read_text().strip() if path.is_file() else ""
    if existing:
        return existing, False
    secret = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(secret + "\n")
    return secret, True
