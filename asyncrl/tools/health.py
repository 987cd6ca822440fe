"""`asyncrl health`: ask a service on this host whether it is SERVING (grpc.health.v1), exit 0 if so.

It is the containers' health check (the Dockerfile's HEALTHCHECK, compose's healthcheck): with no arguments
it reads the role, `--config` and `--set` of the container's main process (PID 1) from /proc, so one command
fits every role of the one image. Kubernetes uses its own gRPC probes on the same health service.
"""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import load_config
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_util import channel
from asyncrl.tools.processes import process_argv

ROLES = ("controller", "rollout", "teacher", "learner")


def command_of(pid: int) -> list[str]:
    """The argv of process `pid` from /proc, from the asyncrl subcommand on (`asyncrl`, `python -m ...` and
    the like dropped)."""
    argv = process_argv(pid)
    for i, arg in enumerate(argv):
        if arg in (*ROLES, "make-tiny-model", "up"):
            return argv[i:]
    return []


def target(cfg: AsyncRLConfig, role: str) -> str:
    """127.0.0.1 and the role's gRPC port from the config."""
    port = getattr(cfg, role).port
    if not port:
        raise ConfigError(f"{role}.port: 0 (any free port) cannot be health-checked; set a fixed port")
    return f"127.0.0.1:{port}"


def check(cfg: AsyncRLConfig, role: str, timeout_s: float) -> tuple[bool, str]:
    """(serving, what was seen) for `role`'s service on this host."""
    address = target(cfg, role)
    with channel(address, resolve_auth(cfg.security)) as ch:
        try:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s).status
        except grpc.RpcError as err:
            return False, f"{role} at {address}: {err.code().name} {err.details() or ''}".strip()
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return status == health_pb2.HealthCheckResponse.SERVING, f"{role} at {address}: {name}"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`parser`: the `asyncrl` command line's, to read the main process's argv as it read it."""
    if args.config:
        role, config, overrides = args.role, args.config, args.set
    else:
        argv = command_of(args.pid)
        if not argv or argv[0] not in ROLES:
            print(f"process {args.pid} runs no service ({' '.join(argv) or 'not asyncrl'}): nothing to check")
            return 0
        main = parser.parse_args(argv)
        role, config, overrides = argv[0], main.config, main.set
    if role not in ROLES:
        raise ConfigError(f"role: {role!r} is not one of {', '.join(ROLES)}")
    serving, seen = check(load_config(config, overrides), role, args.timeout)
    print(seen)
    return 0 if serving else 1
