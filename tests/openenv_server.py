"""The agent demo's OpenEnv calculator (examples/agent/openenv_calculator.py) as a test server process, with
faults on demand: a turn `hang` is never answered, `crash` kills the server mid-call (exit 3).

    python tests/openenv_server.py PORT      (prints "ready" once it listens)
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from openenv.core.env_server import create_app

_spec = importlib.util.spec_from_file_location(
    "openenv_calculator", Path(__file__).resolve().parents[1] / "examples" / "agent" / "openenv_calculator.py")
calculator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calculator)


class FaultyCalculator(calculator.Calculator):
    def step(self, action, timeout_s=None, **kwargs):
        turn = action.message.strip()
        if turn == "hang":
            time.sleep(3600)
        if turn == "crash":
            os._exit(3)
        return super().step(action, timeout_s, **kwargs)


app = create_app(FaultyCalculator, calculator.TurnAction, calculator.ToolObservation, env_name="calculator",
                 max_concurrent_envs=64)


def main() -> None:
    port = int(sys.argv[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
