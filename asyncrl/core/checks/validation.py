"""Request validation shared by every floor: each check raises `InvalidArgument` naming the offending field,
which the service edges answer with INVALID_ARGUMENT (`asyncrl.core.wire.grpc_util.abort_invalid`)."""

from __future__ import annotations

import math
import re

MAX_ECHO = 60
"""Characters of a refused value quoted back in an error (a 1 MB string is not echoed)."""
MAX_NAME = 128
MAX_COUNT = 1 << 53
"""Counters (steps, trajectories) above this are not real."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_REWARD = 1e6
"""Largest reward magnitude a report may carry (a mean reward in a completion, the learner's heartbeat)."""
_HOST = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}"
                   r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]{2,45}\]")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")


class InvalidArgument(ValueError):
    """Raised by request validation; services turn it into INVALID_ARGUMENT naming the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


def require(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise InvalidArgument(field, problem)


def shown(value) -> str:
    """`repr(value)`, cut to MAX_ECHO characters with the full length noted."""
    text = repr(value)
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(value)} characters)"


def check_host_port(value: str, field: str) -> None:
    """host:port with a DNS name, an IPv4 address or a bracketed IPv6 address, and a port in 1..65535."""
    host, sep, port = value.rpartition(":")
    ok = (len(value) <= 300 and bool(sep) and _HOST.fullmatch(host) is not None and port.isdigit()
          and 1 <= int(port) <= 65535)
    require(ok, field, f"must be host:port (a host name or IP address, a port in 1..65535), got {shown(value)}")


def check_name(value: str, field: str, *, optional: bool = False) -> None:
    """An identifier: letters, digits and _.:@- (not first), at most MAX_NAME characters."""
    if optional and not value:
        return
    require(_NAME.fullmatch(value) is not None, field,
            f"must be {'empty or ' if optional else ''}a name of letters, digits and _.:@- (at most {MAX_NAME}), "
            f"got {shown(value)}")


def check_range(value, low, high, field: str) -> None:
    """low <= value <= high, and finite for floats."""
    finite = not isinstance(value, float) or math.isfinite(value)
    require(finite and low <= value <= high, field, f"must be in [{low}, {high}], got {value}")


def check_token_ids(ids, vocab_size: int, field: str) -> None:
    require(len(ids) > 0, field, "must not be empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    require(not bad, field, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
