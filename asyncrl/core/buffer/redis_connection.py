"""One way to connect to the run's Redis (the buffer, the controller's state store, `up`): retries across a
Redis restart, the password and TLS of `BufferConfig`."""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.schema import BufferConfig

log = logging.getLogger(__name__)


def redis_password(cfg: BufferConfig) -> str | None:
    """The password of `cfg` (a BufferConfig): `password_file`, else the environment variable `password_env`."""
    if cfg.password_file:
        path = Path(cfg.password_file)
        if not path.is_file():
            raise ConfigError(f"buffer.password_file: {path} does not exist")
        return path.read_text().strip() or None
    return os.environ.get(cfg.password_env, "").strip() or None


class _Retry(Retry):
    """Retries connection failures, but not a refused password (redis-py's AuthenticationError is a
    ConnectionError): a wrong password fails at once with its own message, not after `retry_s`. Counts the
    failed attempts (`failures`: a caller can tell that a call it made was retried, and that a reply may
    have been lost) and says so in the log, once per SAY_EVERY_S while they go on."""

    def __init__(self, *args, where: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.where = where
        self.counts = {"failures": 0, "said": 0.0}
        """Shared by every connection's copy (redis-py deep-copies the policy into each connection)."""

    def __deepcopy__(self, memo):
        return copy.copy(self)  # the backoff is stateless, the counts are meant to be shared

    @property
    def failures(self) -> int:
        return self.counts["failures"]

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(error: Exception) -> bool:
            return not isinstance(error, redis.AuthenticationError) and (is_retryable is None or is_retryable(error))

        def failed(error, *count):
            self.counts["failures"] += 1
            now = time.monotonic()
            if retryable(error) and now - self.counts["said"] >= SAY_EVERY_S:
                self.counts["said"] = now
                log.warning("Redis at %s did not answer (%s: %s); reconnecting and retrying",
                            self.where, type(error).__name__, error)
            return fail(error, *count)

        return super().call_with_retry(do, failed, retryable, with_failure_count)


SAY_EVERY_S = 10.0


def redis_client(cfg: BufferConfig) -> redis.Redis:
    """A client of `cfg.redis_url` that reconnects and retries for about `cfg.retry_s` (exponential backoff
    0.05 s doubling to 1 s), authenticates as the configured user with its password and, for `rediss://` URLs, verifies
    the server against `tls_ca_file` and presents `tls_cert_file` when given."""
    if not cfg.redis_url:
        raise ConfigError("buffer.redis_url is empty: start Redis (or use `asyncrl up`, which does)")
    retry = _Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=int(cfg.retry_s) + 5 if cfg.retry_s > 0 else 0,
                   where=cfg.redis_url.rsplit("@", 1)[-1])
    options: dict = {"retry": retry, "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
                     "socket_timeout": cfg.socket_timeout_s, "socket_connect_timeout": cfg.socket_timeout_s,
                     "socket_keepalive": True}
    password = redis_password(cfg)
    if password:
        options["password"] = password
    username = os.environ.get(cfg.username_env, "").strip()
    if username:
        options["username"] = username
    if cfg.redis_url.startswith("rediss://"):
        options.update(ssl_ca_certs=cfg.tls_ca_file, ssl_certfile=cfg.tls_cert_file, ssl_keyfile=cfg.tls_key_file,
                       ssl_cert_reqs="required")
    elif cfg.tls_ca_file or cfg.tls_cert_file:
        raise ConfigError("buffer.tls_ca_file: TLS options need a rediss:// URL in buffer.redis_url")
    return redis.Redis.from_url(cfg.redis_url, **options)
