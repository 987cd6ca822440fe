"""One Redis user per role, each allowed the keys and commands its job needs (Redis ACLs), so the password a
replica holds cannot read the controller's state or keys, write the controller's records, or flush the store.

| user | keys | commands |
|---|---|---|
| `asyncrl-rollout` | the stream, its write counters, the dead letters | append (XADD) and count (INCRBY, EXPIRE) in one transaction |
| `asyncrl-learner` | the stream, the dead letters | stream commands (read, ack, delete, dead-letter) |
| `asyncrl-controller` | its state (`controller.state_key`), the write counters | hashes, MGET and DEL of counters |

In a deployment of several runs (`runs:`) the learner's and the replicas' users reach every run's keys (they
serve every run), and each run's controller has a user of its own (`asyncrl-controller-<run>`) that reaches only
its run's: one run's controller cannot read or change another's state.

The default user keeps the run's admin password (`asyncrl up` and the operator's tools). A process logs in as
the user its environment names (`buffer.username_env`) with that user's password (`buffer.password_env`); `up`
derives each user's password from the admin one (`role_password`) and gives each role only its own.
Appending is a replica's job, so a replica can still append a group no lease granted or raise a lease's write
counter; it cannot read or change anything else.
"""

from __future__ import annotations

import hashlib
import hmac

from asyncrl.core.config.schema import BufferConfig

ROLES = ("controller", "learner", "rollout")
CONNECTION = "+ping +multi +exec +discard"
"""What every user may do on a connection: liveness and transactions. (redis-py's CLIENT SETINFO, refused, it
ignores: Redis 7.0 has no such command to allow.)"""


def user_name(role: str, run: str = "") -> str:
    """`role`'s user; in a deployment of several runs (`runs:`) each run's controller has its own (`run`)."""
    return f"asyncrl-{role}-{run}" if run else f"asyncrl-{role}"


def rules(role: str, buffer: BufferConfig, state_key: str, *others: tuple[BufferConfig, str]) -> str:
    """The ACL rules of `role`'s user (keys, channels, commands), without its password; `others`: the (buffer,
    state key) of the other runs it works for (a deployment's learner and replicas serve every run)."""
    keys = []
    for buf, key in ((buffer, state_key), *others):
        stream, dead, counters = buf.stream, buf.dead_letter_stream, f"{buf.stream}:written:*"
        keys += {"rollout": [stream, counters, dead], "learner": [stream, dead],
                 "controller": [f"{key}:*", counters]}[role]
    commands = {"rollout": "+xadd +incrby +expire", "learner": "+@stream",
                "controller": "+@hash +mget +del"}[role]
    return " ".join(["resetkeys", *(f"~{k}" for k in keys), "resetchannels", "-@all", CONNECTION, commands])


def role_password(admin_password: str, role: str) -> str:
    """A role's password, derived from the admin password: holding it gives no way back to the admin's or
    another role's."""
    return hmac.new(admin_password.encode(), f"asyncrl-redis-user\n{role}".encode(), "sha256").hexdigest()


def acl_line(role: str, password: str, buffer: BufferConfig, state_key: str, *others: tuple[BufferConfig, str],
             run: str = "") -> str:  # fmt: skip
    """`role`'s `user` directive for redis.conf (or `--user` on redis-server's command line): the password as
    its SHA-256, so the file holds no secret that logs in. `others`, `run`: see `rules`, `user_name`."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {user_name(role, run)} reset on #{digest} {rules(role, buffer, state_key, *others)}"
