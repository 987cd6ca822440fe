"""The `asyncrl` command's first lines: before the command line parser and the configuration schema are even
imported (about 1.4 s of `up`'s start on two cores), `asyncrl up` starts its fork server, whose imports of
torch, transformers and the services' modules are the rest of the start (`asyncrl.tools.fork_server`). Every
command then runs as `asyncrl.tools.cli` runs it."""

from __future__ import annotations

import sys

from asyncrl.tools.torch_logs import quiet_torch_cpp_logs

GLOBAL_OPTIONS_WITH_VALUE = frozenset({"--log-level"})
"""The parser's options before the subcommand that take a value (`asyncrl --log-level WARNING up ...`)."""


def subcommand(argv: list[str]) -> str | None:
    """The subcommand of an `asyncrl` command line (its first word that is not a global option or its value)."""
    args = iter(argv)
    for arg in args:
        if arg in GLOBAL_OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> int:
    argv = sys.argv[1:]
    quiet_torch_cpp_logs()
    if subcommand(argv) == "up":
        from asyncrl.tools.spawners import child_env, prestart_fork_server

        prestart_fork_server(child_env())
    from asyncrl.tools.cli import main as cli_main

    return cli_main(argv)
