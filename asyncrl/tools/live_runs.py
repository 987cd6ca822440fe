"""Runs added and removed while a deployment of several runs lives (`asyncrl runs add|remove`, docs/lora.md).

`asyncrl runs` checks a change and writes it into the deployment's resolved config; `up` sees the file change
(`LiveRuns.poll`, each second of its watch) and applies it in place:
- an added run: its Redis users are granted its keys, its controller is started, then the learner and the
  replicas are told to read the config again (SIGHUP): each gives the run its adapter and its loop or replica;
- a removed run: the learner stops it after its current step (checkpoint, last records), the replicas stop
  serving it and free its slots, and once its learner log is closed its controller is stopped. Its audit comes
  with the others' at the end.
The other runs go on untouched.
"""

from __future__ import annotations

import signal
from pathlib import Path

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import load_config
from asyncrl.core.config.runs import check_change, run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.tools.processes import ProcessGroup
from asyncrl.tools.run_end import learner_closed_its_log
from asyncrl.tools.run_secrets import refresh_redis_users


def controller_name(run: str) -> str:
    """The name `up` gives the controller process of `run` (its log: logs/controller-<run>.log)."""
    return f"controller-{run}"


class LiveRuns:
    def __init__(self, cfg: AsyncRLConfig, group: ProcessGroup, restartable: dict, start_controller, on_added):
        """`cfg`: the deployment as `up` started it (updated in place as runs come and go); `restartable`: the
        processes `up` restarts by name; `start_controller(run)`: start a run's controller as `up` does (it joins
        `restartable`); `on_added(run, run_cfg)`: what else `up` does for a new run (its progress lines)."""
        self.cfg, self.group, self.restartable = cfg, group, restartable
        self.start_controller, self.on_added = start_controller, on_added
        self.path = Path(cfg.run_dir) / "config.resolved.yaml"
        self._mtime = self._stat()
        self.retiring: dict[str, AsyncRLConfig] = {}
        """Removed runs whose controller still runs: stopped once the learner closed the run's log."""

    def poll(self) -> None:
        """Apply a change of the resolved config's runs, if any; stop the controllers of removed runs done."""
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._apply(load_config(self.path))
            except ConfigError as err:  # `asyncrl runs` checks before writing: an edit by hand can still fail
                print(f"[up] the runs in {self.path} were not applied: {err}", flush=True)
        for run, run_cfg in list(self.retiring.items()):
            if learner_closed_its_log(run_cfg.run_dir):
                self._signal_replicas()  # only now: the run's last push went to them
                self.restartable.pop(controller_name(run), None)
                self.group.stop((controller_name(run),))
                del self.retiring[run]
                print(f"[up] run {run} removed: its learner stopped it, its controller is stopped", flush=True)

    def _apply(self, new: AsyncRLConfig) -> None:
        before = run_configs(self.cfg)
        added = check_change(self.cfg, new)
        removed = [run for run in before if run not in run_configs(new)]
        if not added and not removed:
            return
        self.cfg.runs = new.runs
        refresh_redis_users(self.cfg)
        now = run_configs(self.cfg)
        for run in added:
            self.start_controller(run)
            self.on_added(run, now[run])
            print(f"[up] run {run} added: its controller is starting", flush=True)
        for run in removed:
            self.retiring[run] = before[run]
            print(f"[up] run {run} removed: it stops after its current step", flush=True)
        # The learner reads the runs again now; the replicas for an added run now, for a removed one once its
        # learner has stopped it (`poll`): dropped earlier, they would refuse its last step's push.
        self._signal(lambda name: name == "learner" or (bool(added) and name.startswith("rollout-")))

    def _signal_replicas(self) -> None:
        self._signal(lambda name: name.startswith("rollout-"))

    def _signal(self, which) -> None:
        """SIGHUP to the children `which(name)` picks: they read the runs again."""
        for child in self.group.children:
            if which(child.name):
                child.proc.send_signal(signal.SIGHUP)

    def _stat(self) -> tuple[int, int]:
        """The file's identity and age: `asyncrl runs` writes a new file and renames it over the old one."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return (0, 0)
        return (stat.st_ino, stat.st_mtime_ns)
