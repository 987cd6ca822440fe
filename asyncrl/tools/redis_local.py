"""A local redis-server for `asyncrl up` and the tests (Debian's redis-server package)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import redis

from asyncrl.tools.processes import ProcessGroup, free_port


def start_local_redis(group: ProcessGroup, data_dir: Path, host: str = "127.0.0.1", port: int = 0,
                      password: str | None = None, users: list[str] | tuple = ()) -> str:
    """Start redis-server as a child of `group`; returns its URL once it answers PING. Persistence: an
    append-only file in `data_dir`, written and fsynced before each reply (a restart on the same directory,
    e.g. `up --resume`, finds the stream, its consumer group and the pending entries again). `port` 0: any free port. With a
    `password`, clients must AUTH; it goes into an owner-only config file, not onto the command line, with
`users` (ACL `user` directives, `asyncrl.core.buffer.redis_users.acl_line`).

    Not `everysec`: it postpones the write while a background fsync runs (up to 2 s under I/O load) yet
    replies at once, so a kill -9 lost groups the writers had seen acknowledged. `always` costs 0.4 ms per
    20 KB append here (0.16 ms everysec), far below a group's generation time."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found: run scripts/setup.sh (installs Debian's redis-server)")
    port = port or free_port(host)
    data_dir.mkdir(parents=True, exist_ok=True)
    conf = data_dir / "redis.conf"
    conf.touch(mode=0o600)
    quoted = (password or "").replace("\\", "\\\\").replace('"', '\\"')  # a double-quoted redis.conf string
    conf.write_text((f'requirepass "{quoted}"\n' if password else "") + "".join(f"{line}\n" for line in users))
    child = group.start("redis", [binary, str(conf), "--port", str(port), "--bind", host, "--save", "",
                                  "--appendonly", "yes", "--appendfsync", "always", "--dir", str(data_dir)])
    url = f"redis://{host}:{port}/0"
    client = redis.Redis.from_url(url, password=password)
    deadline = time.time() + 20
    while True:
        try:
            client.ping()
            return url
        except redis.ConnectionError:
            if not child.alive() or time.time() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{child.tail()}") from None
            time.sleep(0.1)
