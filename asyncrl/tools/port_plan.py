"""The fixed ports a local run (`asyncrl up`) will listen on, checked before anything starts.

A port the config fixes is bound by one process: `rollout.port` and `rollout.metrics_port` by every replica,
counting up from the configured one (replica i on port + i). Two of them on the same port, or one that another
program already holds, would make a process exit at start, and `up` would restart it until it runs out of
restarts: a run that ends minutes later, with a traceback in one replica's log. Checked here instead, the
start is refused at once with the key to change. Ports left at 0 are picked free by each process and cannot
collide. (What is checked is free now: a program that takes a port between this check and the bind still
makes that process fail, with the same key in its error.)
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.wire.ports import why_not_listenable

WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class PlannedPort:
    key: str
    """The config key that sets it ("rollout.metrics_port")."""
    owner: str
    """Who listens there ("replica-1", "the controller")."""
    host: str
    port: int

    def describe(self) -> str:
        return f"{self.owner}'s {self.host}:{self.port}"

    def clashes_with(self, other: PlannedPort) -> bool:
        """Both on one port of one address (a wildcard address holds that port on every address)."""
        return self.port == other.port and (self.host == other.host or bool({self.host, other.host} & WILDCARDS))


REPLICA_PORTS = ("port", "metrics_port")
"""The rollout fields every replica listens on, each at the configured port + its index."""


def replica_port(rollout, field: str, index: int) -> int:
    """Where replica `index` listens for `rollout.<field>` under `up`: the configured port + index (0 stays 0:
    the replica picks a free one)."""
    base = getattr(rollout, field)
    return base + index if base else 0


def planned_ports(cfg: AsyncRLConfig) -> list[PlannedPort]:
    """Every nonzero port the processes `up` starts for `cfg` listen on (after `resolve` picked its own); with
    `runs:`, every run's (`asyncrl.core.config.runs`: run i at the deployment's ports + PORT_STRIDE * i) and the
    one teacher the runs share."""
    runs = run_configs(cfg)
    if runs:
        return [*(PlannedPort(p.key, f"run {run}: {p.owner}", p.host, p.port)
                  for run, run_cfg in runs.items() for p in _ports(run_cfg, teacher=False)),
                *_ports(cfg, controller=False, learner=False, replicas=False)]
    return _ports(cfg)


def _ports(cfg: AsyncRLConfig, controller: bool = True, teacher: bool = True, learner: bool = True,
           replicas: bool = True) -> list[PlannedPort]:
    """The nonzero ports of the chosen processes of one run's config."""
    c, t, r, lr = cfg.controller, cfg.teacher, cfg.rollout, cfg.learner
    wanted = []
    if controller:
        wanted += [("controller.port", "the controller", c.host, c.port),
                   ("controller.status_port", "the controller", c.host, c.status_port)]
    if learner:
        wanted += [("learner.port", "the learner", lr.host, lr.port),
                   ("learner.metrics_port", "the learner", lr.host, lr.metrics_port),
                   ("learner.weight_transport.store_port", "the learner", lr.weight_transport.host,
                    lr.weight_transport.store_port)]
    if teacher and t.enabled:
        wanted += [("teacher.port", "the teacher", t.host, t.port),
                   ("teacher.metrics_port", "the teacher", t.host, t.metrics_port)]
    for i in range(r.replicas if replicas else 0):
        wanted += [(f"rollout.{field}", f"replica-{i}", r.host, replica_port(r, field, i)) for field in REPLICA_PORTS]
    return [PlannedPort(key, owner, host, port) for key, owner, host, port in wanted if port]


def check_ports(cfg: AsyncRLConfig) -> None:
    """Refuse a local run whose fixed ports collide with each other or are taken (ConfigError naming the key)."""
    ports = planned_ports(cfg)
    for i, port in enumerate(ports):
        for earlier in ports[:i]:
            if port.clashes_with(earlier):
                raise ConfigError(f"{port.key}: {port.describe()} is also {earlier.key} ({earlier.describe()}); "
                                  "give them ports that do not overlap (replica i listens on the configured port + i)")
    for port in ports:
        reason = why_not_listenable(port.host, port.port)
        if reason:
            raise ConfigError(f"{port.key}: cannot listen on {port.describe()}: {reason}; choose another port, or "
                              "0 for any free one")
