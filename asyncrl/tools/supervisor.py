"""`asyncrl up`'s watch over its processes: live progress from the learner's event log, and restarts.

What dies is started again, each at most its `max_restarts` times:
- a rollout replica, under its id: it re-registers, is resynced, gets leases again;
- the teacher and the controller, on their ports (the controller restores its state from Redis; the others'
  calls wait for it and retry);
- the local redis-server, on its port and append-only file (`buffer.local_max_restarts`; clients reconnect);
- the learner, from its latest checkpoint (`learner.max_restarts`), or the base model when it has none yet: it
  takes the run back there (`Controller.ResetTimeline`) and trains on; never into the cause of its last death
  unchanged (`asyncrl.tools.learner_deaths`), each death recorded in its log (`learner_died`).
Anything else that dies, or a process out of restarts, ends the run (exit code 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.learner import Eval, LearnerDied, Step
from asyncrl.core.runtime.events import EventLog, EventTail
from asyncrl.learner.checkpoint_index import latest_checkpoint
from asyncrl.tools.learner_deaths import MEMORY_SETTINGS, judge, oom_kills
from asyncrl.tools.live_runs import LiveRuns
from asyncrl.tools.processes import Child, ProcessGroup
from asyncrl.tools.run_secrets import start_run_redis


@dataclass
class Restartable:
    """A process `up` restarts when it dies, and how to start it again."""

    child: Child
    argv: list[str]
    env: dict[str, str] | None
    max_restarts: int
    restarts: int = 0

    def restart(self, group: ProcessGroup) -> None:
        self.restarts += 1
        self.child.kill_leftovers()
        group.children.remove(self.child)
        self.child = group.start_cli(self.child.name, self.argv, self.env)


class Supervisor:
    def __init__(self, cfg: AsyncRLConfig, group: ProcessGroup, learner: Restartable,
                 restartable: dict[str, Restartable], vmstat: str = "/proc/vmstat", start_controller=None):  # fmt: skip
        """`start_controller(run)`: how `up` starts a run's controller, for runs added while the deployment
        lives (`asyncrl.tools.live_runs`; with `runs:` only)."""
        self.cfg, self.group, self.learner, self.restartable = cfg, group, learner, restartable
        runs = run_configs(cfg)
        self.progress = [Progress(run_cfg, f"{run}: ") for run, run_cfg in runs.items()] or [Progress(cfg)]
        """One per run (`runs:`: the learner trains several)."""
        self.learner_dirs = [run_cfg.run_dir for run_cfg in runs.values()] or [cfg.run_dir]
        """Where the learner keeps its event logs: one per run."""
        self.live = None if not runs else LiveRuns(cfg, group, restartable, start_controller, self._added)
        """Runs added and removed while the deployment lives."""
        self.redis_restarts = 0
        self.vmstat = vmstat
        """Where the kernel counts its out-of-memory kills."""
        self.oom_kills = oom_kills(vmstat)
        self.turned_off: set[str] = set()
        """Memory settings a restart of the learner turned off (`learner_deaths.MEMORY_SETTINGS`)."""

    def run(self) -> int:
        """Supervise until the learner finishes; returns the run's exit code."""
        while True:
            self._poll()
            learner = self.learner.child
            if not learner.alive():
                code = learner.proc.returncode
                if code == 0 or not self._restart_learner(code):
                    self._poll()
                    return code
            for child in self.group.failed():
                if child is not self.learner.child and not self._restart(child):
                    print(f"[up] {child.name} exited with {child.proc.returncode}; last lines:\n{child.tail()}",
                          flush=True)
                    return 1
            self.group.wait_for_an_exit(1.0)

    def _poll(self) -> None:
        if self.live is not None:
            self.live.poll()
        for progress in self.progress:
            progress.poll()

    def _added(self, run: str, run_cfg: AsyncRLConfig) -> None:
        self.progress.append(Progress(run_cfg, f"{run}: "))
        self.learner_dirs.append(run_cfg.run_dir)

    def _restart_learner(self, code: int) -> bool:
        now = oom_kills(self.vmstat)
        rose = None not in (now, self.oom_kills) and now > self.oom_kills
        self.oom_kills = now
        verdict = judge(code, rose, tuple(s for s in MEMORY_SETTINGS if self._on(s) and s not in self.turned_off))
        out_of_restarts = verdict.restart and self.learner.restarts >= self.learner.max_restarts
        action = f"not restarted: out of restarts ({self.learner.max_restarts})" if out_of_restarts else verdict.why
        self._record(LearnerDied(exit_code=code, cause=verdict.cause, action=action))
        if out_of_restarts or not verdict.restart:
            print(f"[up] learner failed (exit {code}), {action}:\n{self.learner.child.tail()}", flush=True)
            return False
        for setting in verdict.turn_off:
            self.learner.argv += ["--set", f"{setting}=false"]
            self.turned_off.add(setting)
        if len(self.learner_dirs) > 1:
            start = "each run's latest checkpoint"
        else:
            ckpt = latest_checkpoint(self.cfg.run_dir)
            start = f"its checkpoint {ckpt.name}" if ckpt is not None else "the base model (no checkpoint yet)"
        print(f"[up] learner exited with {code}, {action}; restarting it from {start} "
              f"({self.learner.restarts + 1}/{self.learner.max_restarts})", flush=True)
        self.learner.restart(self.group)
        return True

    def _on(self, setting: str) -> bool:
        """Whether one of `MEMORY_SETTINGS` is on in the run's config."""
        learner = self.cfg.learner
        if setting == "learner.checkpoint.background":
            return learner.checkpoint.background
        return learner.push_in_background

    def _record(self, record) -> None:
        """Into the learner's event log, each run's (its writer is dead; a restarted one appends after)."""
        for run_dir in self.learner_dirs:
            log = EventLog(run_dir, "learner")
            try:
                log.write(record)
            finally:
                log.close()

    def _restart(self, child: Child) -> bool:
        if child.name == "redis" and self.redis_restarts < self.cfg.buffer.local_max_restarts:
            self.redis_restarts += 1
            print(f"[up] redis-server exited with {child.proc.returncode}; restarting it on its append-only "
                  f"file ({self.redis_restarts}/{self.cfg.buffer.local_max_restarts})", flush=True)
            child.kill_leftovers()
            self.group.children.remove(child)
            restart_local_redis(self.group, self.cfg)
            return True
        proc = self.restartable.get(child.name)
        if proc is None or proc.child is not child or proc.restarts >= proc.max_restarts:
            return False
        print(f"[up] {child.name} exited with {child.proc.returncode}; restarting it "
              f"({proc.restarts + 1}/{proc.max_restarts})", flush=True)
        proc.restart(self.group)
        return True


def restart_local_redis(group: ProcessGroup, cfg: AsyncRLConfig) -> None:
    """The run's redis-server again, on the same port and data directory (the clients reconnect)."""
    host_port = cfg.buffer.redis_url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    start_run_redis(group, cfg, host=host, port=int(port))


def _busy(ev: Step) -> str:
    """The learner's share of the wall time in train steps over its last steps, as " (91% of the time)";
    nothing for an older event log."""
    busy = ev.metrics.get("time/busy")
    return "" if busy is None else f" ({busy:.0%} of the time)"


class Progress:
    """Prints one line per learner step / eval from the learner's event log."""

    def __init__(self, cfg: AsyncRLConfig, label: str = ""):
        self.cfg = cfg
        self.label = label
        """Before each line (a run's name when the learner trains several)."""
        self.tail = EventTail(cfg.run_dir, "learner", from_end=bool(cfg.learner.checkpoint.resume_from))
        self.start = time.time()
        self.first_eval: float | None = None
        self.steps_seen = 0
        self._said_waiting = self.start

    def poll(self) -> None:
        now = time.time()
        if self.steps_seen == 0 and now - self._said_waiting >= 5.0:
            # Until the first step the log is silent: say what the run is waiting for.
            self._said_waiting = now
            print(f"[{now - self.start:6.0f}s] {self.label}waiting for the first learner step (the replicas generate the first "
                  f"batch of {self.cfg.learner.batch_size} trajectories)", flush=True)
        for ev in self.tail.poll():
            elapsed = time.time() - self.start
            if isinstance(ev, Step):
                self.steps_seen += 1
                m = ev.metrics
                print(f"[{elapsed:6.0f}s] {self.label}step {ev.step:3d}/{self.cfg.learner.total_steps} "
                      f"v{ev.version:<3d} reward {m['reward/mean']:.3f} "
                      f"staleness mean {m['staleness/mean']:.2f} max {m['staleness/max']} "
                      f"train {1e3 * m['time/step_s']:.0f} ms{_busy(ev)}, push wait {1e3 * ev.push_wait_s:.0f} ms",
                      flush=True)
            elif isinstance(ev, Eval):
                if self.first_eval is None:
                    self.first_eval = ev.accuracy
                print(f"[{elapsed:6.0f}s] {self.label}eval  step {ev.step:3d}: greedy accuracy {ev.accuracy:.3f} "
                      f"(start {self.first_eval:.3f})", flush=True)


