"""A whole run with every service on a host of its own (the network tier): Redis, the controller, the teacher,
the learner and each rollout replica in a namespace of a `Lab`, and `asyncrl up`'s own launch, supervision,
stop and audit driving them from one more host, the operator.

`start_lab_run(lab, config, run_dir, overrides)` adds the hosts, writes nothing but the run directory, and
starts the operator (`python -m asyncrl.tools.lab_run`, inside the operator's namespace: the only place from
which the services' addresses are reachable); `LabRun.wait()` returns the run's summary (audit included).
Meanwhile the caller shapes and cuts the links with the `Lab`. The machine's file system is shared: every
host reads the same model and writes the same run directory.

Each host binds its own address on fixed ports (no two services share a host); the replicas bind every
interface and register the address that routes to the controller. Of the secrets, each host gets what its
role needs: the learner secret goes to the controller and the learner only, and each role logs in to Redis
as its own user (`asyncrl.tools.run_secrets.redis_role_env`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.config.file import load_config
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.tools.netlab import Lab
from asyncrl.tools.processes import Child, ProcessGroup

OPERATOR = "operator"
REDIS_PORT = 6379
SERVICES = ("redis", "controller", "teacher", "learner")
"""The hosts every run has besides the operator and the replicas (`replica-<i>`; the teacher's only when
enabled)."""
LEARNER_SECRET_HOLDERS = ("controller", "learner")


def replica_host(index: int) -> str:
    return f"replica-{index}"


def host_of(child: str) -> str:
    """The lab host a child of the run's process group runs on (`up` names replica i's child `rollout-i`);
    anything else (`asyncrl check`) on the operator."""
    if child.startswith("rollout-"):
        return replica_host(int(child.removeprefix("rollout-")))
    return child if child in SERVICES else OPERATOR


def placed(cfg: AsyncRLConfig, addresses: dict[str, str]) -> AsyncRLConfig:
    """`cfg` with every service on its host's address (`addresses`: lab host -> address) and fixed ports: the
    controller, teacher and learner bind and are dialled there; the replicas bind every interface."""
    cfg = cfg.model_copy(deep=True)
    cfg.controller.host = addresses["controller"]
    cfg.teacher.host = addresses.get("teacher", cfg.teacher.host)
    cfg.learner.host = cfg.learner.weight_transport.host = addresses["learner"]
    cfg.rollout.host = "0.0.0.0"
    cfg.rollout.advertise_host = None
    return cfg


class PlacedGroup(ProcessGroup):
    """`up`'s process group, each child started in its lab host's namespace (`netns`: lab host -> namespace),
    restarts included; the learner secret removed from the environment of every host but its holders'."""

    def __init__(self, log_dir: Path, netns: dict[str, str], learner_secret_env: str):
        super().__init__(log_dir)
        self.netns, self.learner_secret_env = netns, learner_secret_env

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Child:
        host = host_of(name)
        env = dict(env or {})
        if host not in LEARNER_SECRET_HOLDERS:
            env[self.learner_secret_env] = ""
        if host == OPERATOR or host not in self.netns:
            return super().start(name, argv, env)
        return super().start(name, ["ip", "netns", "exec", self.netns[host], *argv], env)


def operate(config_path: str, overrides: list[str], run_dir: str, netns: dict[str, str],
            addresses: dict[str, str]) -> int:
    """The operator's part (in its own namespace): Redis on its host, then `asyncrl up`'s launch, supervision,
    stop and audit of the placed config."""
    from asyncrl.tools.launcher import launch
    from asyncrl.tools.models_ready import ensure_models
    from asyncrl.tools.run_secrets import start_run_redis

    cfg = load_config(config_path, overrides)
    cfg.run_dir = run_dir
    cfg = placed(cfg, addresses)
    ensure_models(cfg)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    group = PlacedGroup(Path(run_dir) / "logs", netns, cfg.security.learner_secret_env)
    try:
        cfg.buffer.redis_url = start_run_redis(group, cfg, host=addresses["redis"], port=REDIS_PORT)
        return launch(cfg, group)
    except BaseException:
        group.stop_all()
        raise


@dataclass
class LabRun:
    """A run started by `start_lab_run`: its operator process and where it writes."""

    lab: Lab
    run_dir: Path
    operator: subprocess.Popen
    config: AsyncRLConfig
    """The run's config as its services see it (placed on the lab's addresses)."""

    def wait(self, timeout_s: float) -> dict:
        """Wait for the run to end (its learner done, everything stopped, the audit written); its summary
        (`summary.json`: the audit, the accuracy) with the operator's exit code as `exit_code`."""
        try:
            code = self.operator.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.operator.terminate()
            self.operator.wait(timeout=60)
            raise TimeoutError(f"the run in {self.run_dir} did not end within {timeout_s:.0f} s; operator log:\n"
                               f"{self.operator_log()}") from None
        path = self.run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
        return {**summary, "exit_code": code}

    def stop(self, timeout_s: float = 180) -> dict:
        """End the run as Ctrl-C ends `up` (its learner's step finished, everything stopped, then the audit, which
        says how far the run got); its summary, as `wait` returns it."""
        if self.operator.poll() is None:
            self.operator.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def operator_log(self, lines: int = 40) -> str:
        path = self.run_dir / "operator.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def start_lab_run(lab: Lab, config_path: str | Path, run_dir: str | Path, overrides: tuple[str, ...] = ()) -> LabRun:
    """Add the run's hosts to `lab` (those it does not have yet: the operator, Redis, the controller, the
    teacher when enabled, the learner, `rollout.replicas` replicas) and start the operator on its own."""
    run_dir = Path(run_dir).resolve()
    cfg = load_config(config_path, list(overrides))
    hosts = [OPERATOR, "redis", "controller", *(["teacher"] if cfg.teacher.enabled else []), "learner",
             *(replica_host(i) for i in range(cfg.rollout.replicas))]
    for name in hosts:
        if name not in lab.hosts:
            lab.add_host(name)
    netns = {name: lab.hosts[name].netns for name in hosts}
    addresses = {name: lab.hosts[name].address for name in hosts}
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "asyncrl.tools.lab_run", "--config", str(config_path), "--run-dir", str(run_dir),
            "--netns", json.dumps(netns), "--addresses", json.dumps(addresses)]
    for override in overrides:
        argv += ["--set", override]
    with open(run_dir / "operator.log", "ab") as log:
        operator = lab.run(OPERATOR, argv, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    cfg.run_dir = str(run_dir)
    return LabRun(lab=lab, run_dir=run_dir, operator=operator, config=placed(cfg, addresses))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--netns", required=True, help="JSON: lab host -> network namespace")
    parser.add_argument("--addresses", required=True, help="JSON: lab host -> address")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args(argv)
    from asyncrl.tools.launcher import stop_on_signals

    stop_on_signals()
    return operate(args.config, args.overrides, args.run_dir, json.loads(args.netns), json.loads(args.addresses))


if __name__ == "__main__":
    sys.exit(main())
