"""A service's announced line (its ports) arrives whole on an unbuffered stdout that another thread's log lines
share (as `up` and the tests read a service's log): none runs into a log line."""

from __future__ import annotations

import subprocess
import sys

LINES = 2000
SCRIPT = f"""
import logging, sys, threading
from asyncrl.core.runtime.announce import announce
logging.basicConfig(level=logging.INFO, format="%(asctime)s log %(message)s")
logger = threading.Thread(target=lambda: [logging.info("a log line") for _ in range({LINES})])
logger.start()
for _ in range({LINES}):
    announce("asyncrl-learner run a listening grpc=127.0.0.1:40001 metrics=127.0.0.1:40425")
logger.join()
"""


def test_an_announced_line_never_runs_into_another_threads_log_line():
    out = subprocess.run([sys.executable, "-u", "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, check=True, timeout=60).stdout
    lines = out.splitlines()
    announced = [line for line in lines if "listening" in line]
    assert announced == ["asyncrl-learner run a listening grpc=127.0.0.1:40001 metrics=127.0.0.1:40425"] * LINES
    assert sum(line.endswith(" log a log line") for line in lines) == LINES
