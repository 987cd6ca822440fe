"""The fork server of `asyncrl up`: one interpreter imports what every service imports (torch, transformers,
the services' modules) once, then forks each service of the run from there.

On two cores, five interpreters importing torch and transformers at once take 2.5-3 times as long as one
(13.5 s against 5.5 s on AVX2 cores), before the first of them runs a line of asyncrl. The server itself runs
nothing but imports, so what it forks from holds no lock, thread pool or connection that a child could inherit
half-made (OpenBLAS's pool, which numpy starts,
is torn down around a fork by OpenBLAS itself).

The protocol is one JSON line each way on the server's stdin and stdout: first the server's readiness
(`{"ready": true}`, or `{"ready": false, "why": ...}` before it exits), then per request
`{"args": [...], "env": {...}, "log": PATH, "cwd": DIR, "title": ...}` -> `{"pid": N}` or `{"error": ...}`.
Each service is forked twice, so its parent is `up` (a child subreaper, `asyncrl.tools.spawners`), not the
server: `up` waits for it, reads its exit code and restarts it as it does a process it spawned, and the server
can die without taking a service with it. A service leads a session of its own, writes to its log file and
shows its own command line (`ps`, `pgrep -f`). End of input (`up` gone) ends the server.

    python -m asyncrl.tools.fork_server     (started by `asyncrl up`; not a command to run by hand)
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback

PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "asyncrl.services.controller_service",
    "asyncrl.services.rollout_service",
    "asyncrl.services.teacher_service",
    "asyncrl.services.learner_service",
)
"""What every service of a local run imports before its first line of work; what a service imports beyond
these (vLLM, a user's reward module) it imports itself, after the fork."""


def _reply(out, message: dict) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def serve() -> None:
    stdin, stdout = sys.stdin, sys.stdout
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # `up` stops the run; the server ends with its input
    try:
        for module in PRELOAD:
            importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - reported to `up`, which then starts fresh interpreters
        _reply(stdout, {"ready": False, "why": f"importing {module}: {type(err).__name__}: {err}"})
        return
    _reply(stdout, {"ready": True})
    for line in stdin:
        try:
            request = json.loads(line)
            _reply(stdout, {"pid": fork_service(request)})
        except Exception as err:  # noqa: BLE001 - one bad request fails that start, not the server
            _reply(stdout, {"error": f"{type(err).__name__}: {err}"})
    # Without the interpreter's teardown: torch's and transformers' finalizers held the run's exit for
    # seconds, and the server holds nothing that must be flushed.
    os._exit(0)


def fork_service(request: dict) -> int:
    """Fork the service of `request` twice (its parent becomes `up`, the subreaper); its pid, once it leads its
    own session under its own title (so `up` may signal its group and `pgrep -f` finds it from then on)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            if os.fork() == 0:
                _become(request, write_end)  # never returns
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()  # until the service closes its end (the middle one has exited)
    os.waitpid(middle, 0)  # once it is reaped, its child belongs to `up`
    if not text:
        raise RuntimeError("the forked service ended before it started")
    return int(text)


def _become(request: dict, started) -> None:
    """In the forked child: the process a fresh `python -m asyncrl.tools.cli ARGS` would have been. Its pid goes
    to `started` (a pipe's end) once it has its own session and title."""
    code = 1
    try:
        os.setsid()  # a session of its own, as `up` gives every child
        _set_title(request["title"])
        os.write(started, str(os.getpid()).encode())
        os.close(started)
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's pipes and the log's first descriptor
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reseed()
        from asyncrl.tools import cli

        sys.argv = [cli.__file__, *request["args"]]
        code = cli.main(request["args"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - what a fresh interpreter would print before exiting 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _set_title(title: str) -> None:
    """The command line `ps` and `pgrep -f` show: the service's own, not the server's."""
    import setproctitle

    setproctitle.setproctitle(title)


def _reseed() -> None:
    """numpy's global generator is seeded at import from the OS: a fresh interpreter gets a seed of its own,
    so each forked child does too (Python's `random` reseeds itself after a fork; torch's default generator
    starts from the same fixed seed in every interpreter, as it would)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


if __name__ == "__main__":
    serve()
