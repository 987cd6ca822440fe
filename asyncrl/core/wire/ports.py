"""Listening on a configured port: a port another program holds, or an address this machine does not have, is
the user's to fix, so it is reported as a `ConfigError` naming the key (`listening`), not as a traceback from
deep inside gRPC or http.server. `asyncrl up` checks every fixed port of a run before it starts anything
(`asyncrl.tools.port_plan`) with the same probe (`why_not_listenable`)."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator

from asyncrl.core.checks.config_error import ConfigError

GRPC_BIND_FAILURE = "Failed to bind to address"
"""How grpc's add_port says it could not listen (a RuntimeError)."""


def why_not_listenable(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port now (None: it could), tried the way the servers bind
    (SO_REUSEADDR, so a port left in TIME_WAIT by a process that just ended counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return _reason(err, host)
    return None


BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})
"""What binding a socket fails with for a reason in the config: taken, not this machine's, privileged."""


def _reason(err: OSError, host: str) -> str:
    if err.errno == errno.EADDRINUSE:
        return "another program listens there"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine"
    if isinstance(err, socket.gaierror):
        return f"{host} does not resolve ({err.strerror})"
    return err.strerror or str(err)


@contextlib.contextmanager
def listening(key: str, host: str, port: int) -> Iterator[None]:
    """Around starting a server on host:port: a failure to listen there becomes a ConfigError naming `key`.
    Any other error passes unchanged (a missing TLS file is not the port's fault)."""
    try:
        yield
    except socket.gaierror as err:
        raise ConfigError(f"{key}: cannot listen on {host}:{port}: {_reason(err, host)}") from err
    except OSError as err:
        if err.errno is not None and err.errno not in BIND_ERRNOS:
            raise
        # An error without an errno (a server that says only that it could not bind): probe for the reason.
        reason = _reason(err, host) if err.errno is not None else _probed(host, port)
        raise ConfigError(f"{key}: cannot listen on {host}:{port}: {reason or err}") from err
    except RuntimeError as err:
        if GRPC_BIND_FAILURE not in str(err):
            raise
        raise ConfigError(f"{key}: cannot listen on {host}:{port}: {_probed(host, port) or err}") from err


def _probed(host: str, port: int) -> str | None:
    return why_not_listenable(host, port) if port else None
