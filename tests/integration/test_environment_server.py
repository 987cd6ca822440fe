"""Episodes against a real environment server process (tests/env_server.py, reached by the tool in
tests/env_tools.py): answers arrive, a call that hangs ends only its episode at the time limit, a server killed
mid-call turns every call into an error the model reads (nothing wedges, the other episodes go on), and once the
server is started again the calls succeed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.core.agents.episode import DONE, TIMEOUT
from asyncrl.core.agents.tool_env import ToolEnvironment
from asyncrl.core.agents.tools import load_tools
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.tools.processes import free_port
from tests.unit.test_agents import CALL, Scripted, exact, runner_for, sums

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture
def env_server(monkeypatch):
    port = free_port()
    monkeypatch.setenv("ASYNCRL_TEST_ENV_URL", f"http://127.0.0.1:{port}")

    def start():
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "env_server.py"), str(port)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    procs = [start()]
    yield procs, start
    for proc in procs:
        proc.kill()
        proc.wait()


def play(prompts_and_turns, step_timeout_s=1.5):
    chars = ModelTokenizer.chat_chars()
    env = ToolEnvironment(load_tools([f"{ROOT}/tests/env_tools.py:add"]), exact)
    prompts = sums(chars, *[pair for pair, _ in prompts_and_turns])
    script = Scripted(chars, {p.token_ids[2]: list(turns) for p, (_, turns) in zip(prompts, prompts_and_turns)})
    runner = runner_for(env, script, chars, step_timeout_s=step_timeout_s, max_episode_tokens=2000, max_context=4096)
    try:
        return runner.run(prompts)
    finally:
        runner.close()


def test_episodes_survive_a_hanging_call_and_a_server_killed_mid_call(env_server):
    procs, start = env_server
    ok = play([((1, 2), [CALL % (1, 2), "3"]), ((2, 5), [CALL % (2, 5), "7"])])
    assert [(r.end_reason, r.reward) for r in ok] == [(DONE, 1.0), (DONE, 1.0)]
    assert all(t.ok for r in ok for t in r.tools)

    hung, fine = play([((6, 6), [CALL % (-666, 6), "-660"]), ((3, 4), [CALL % (3, 4), "7"])])
    assert hung.end_reason == TIMEOUT and hung.reward == 0.0
    assert fine.end_reason == DONE and fine.reward == 1.0

    # The server dies in the middle of a call: that call and every later one fail, and the model reads why.
    killed, later = play([((9, 9), [CALL % (-999, 9), "-990"]), ((4, 4), [CALL % (4, 4), CALL % (4, 4), "8"])],
                         step_timeout_s=5)
    procs[0].wait(timeout=10)
    assert procs[0].returncode == 3
    assert killed.end_reason == DONE and not killed.tools[0].ok
    assert later.end_reason == DONE and not later.tools[-1].ok
    chars = ModelTokenizer.chat_chars()
    observation = chars.hf.decode(killed.token_ids[killed.observation_starts[0]:killed.observation_ends[0]])
    assert observation.startswith("<tool>error: ")

    procs.append(start())  # restarted: calls succeed again
    (again,) = play([((5, 6), [CALL % (5, 6), "11"])])
    assert again.end_reason == DONE and again.reward == 1.0 and again.tools[0].ok
