"""Episodes against a real OpenEnv environment server process (`environment.type: openenv`; the agent demo's
calculator, examples/agent/openenv_calculator.py, with faults on demand in tests/openenv_server.py), through
OpenEnv's own client: the reset observation follows the prompt, each turn is an action and each observation
the model's next message, the server's reward scores the episode; a call that hangs ends only its episode, an
observation without the field the config names is an environment error, a server killed mid-call ends the
episodes it held and refuses new ones (nothing wedges) until it is started again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.core.agents.episode import DONE, ENVIRONMENT_ERROR, TIMEOUT
from asyncrl.core.agents.openenv_env import OpenEnvEnvironment
from asyncrl.core.config.environment import OpenEnvConfig
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.tools.processes import free_port
from tests.unit.test_agents import CALL, Scripted, runner_for, sums

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture
def openenv_server():
    port = free_port()

    def start():
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "openenv_server.py"), str(port)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    procs = [start()]
    yield f"http://127.0.0.1:{port}", procs, start
    for proc in procs:
        proc.kill()
        proc.wait()


def play(url: str, prompts_and_turns, step_timeout_s=2.0, **openenv):
    chars = ModelTokenizer.chat_chars()
    cfg = OpenEnvConfig(**{"url": url, "observation_field": "text", "observation_role": "tool",
                           "reset_fields": ["answer"], **openenv})
    env = OpenEnvEnvironment(cfg, step_timeout_s)
    prompts = sums(chars, *[pair for pair, _ in prompts_and_turns])
    script = Scripted(chars, {p.token_ids[2]: list(turns) for p, (_, turns) in zip(prompts, prompts_and_turns)})
    runner = runner_for(env, script, chars, step_timeout_s=step_timeout_s, max_episode_tokens=2000, max_context=4096)
    try:
        return runner.run(prompts), chars
    finally:
        runner.close()
        env.close()


def test_episodes_play_against_an_openenv_server(openenv_server):
    url, _, _ = openenv_server
    (right, wrong), chars = play(url, [((1, 2), [CALL % (1, 2), "3"]), ((20, 5), [CALL % (20, 5), CALL % (2, 2), "9"])])
    assert [(r.end_reason, r.reward, r.turns) for r in (right, wrong)] == [(DONE, 1.0, 2), (DONE, 0.0, 3)]
    # The tool's answer is the observation between the turns, as the chat template renders a tool message.
    observation = chars.hf.decode(right.token_ids[right.observation_starts[0]:right.observation_ends[0]])
    assert observation == "<tool>3<assistant>"
    # The calculator's reset observation is empty: the first context is the prompt alone.
    assert right.context == chars.render_chat([{"role": "user", "content": "1+2="}], add_generation_prompt=True)


def test_the_whole_observation_as_json_when_no_field_is_named(openenv_server):
    url, _, _ = openenv_server
    (result,), chars = play(url, [((1, 2), [CALL % (1, 2), "3"])], observation_field=None)
    observation = chars.hf.decode(result.token_ids[result.observation_starts[0]:result.observation_ends[0]])
    assert observation == '<tool>{"text": "3"}<assistant>' and result.reward == 1.0


def test_a_hanging_call_ends_only_its_episode(openenv_server):
    url, _, _ = openenv_server
    (hung, fine), _ = play(url, [((6, 6), [CALL % (6, 6), "hang"]), ((3, 4), [CALL % (3, 4), "7"])],
                           step_timeout_s=1.0)
    assert (hung.end_reason, hung.reward) == (TIMEOUT, 0.0)
    assert (fine.end_reason, fine.reward) == (DONE, 1.0)


def test_an_observation_without_the_named_field_is_an_environment_error(openenv_server):
    url, _, _ = openenv_server
    (result,), _ = play(url, [((1, 2), [CALL % (1, 2), "3"])], observation_field="stdout")
    assert (result.end_reason, result.reward, result.turns) == (ENVIRONMENT_ERROR, 0.0, 0)  # at the reset


def test_a_server_killed_mid_call_ends_its_episodes_and_serves_again_once_restarted(openenv_server):
    url, procs, start = openenv_server
    (killed, other), _ = play(url, [((9, 9), [CALL % (9, 9), "crash"]), ((4, 4), [CALL % (4, 4), "8"])],
                              step_timeout_s=5.0)
    procs[0].wait(timeout=10)
    assert procs[0].returncode == 3
    assert killed.end_reason == ENVIRONMENT_ERROR and killed.reward == 0.0
    assert other.reward in (0.0, 1.0)  # done before the crash, or ended by it: never wedged
    (refused,), _ = play(url, [((1, 1), ["2"])], step_timeout_s=2.0)
    assert refused.end_reason == ENVIRONMENT_ERROR and refused.turns == 0
    procs.append(start())
    (served,), _ = play(url, [((1, 1), [CALL % (1, 1), "2"])])
    assert (served.end_reason, served.reward) == (DONE, 1.0)


def test_a_warm_start_reference_episode_plays_its_target_turns_against_the_server(openenv_server):
    """What a tiny model's warm start over OpenEnv trains on: the task's target turns, the server's answers
    between them, out of the loss."""
    from asyncrl.core.agents.factory import Episodes
    from asyncrl.core.agents.reference import reference_episode
    from asyncrl.core.config.data import TaskConfig
    from asyncrl.core.config.environment import EnvironmentConfig
    from asyncrl.core.tasks import get_task

    url, _, _ = openenv_server
    task = get_task(TaskConfig(name="tool_sum", num_digits=2, num_terms=3, eval_size=10))
    openenv = OpenEnvConfig(url=url, observation_field="text", observation_role="tool", reset_fields=["answer"])
    episodes = Episodes.for_task(EnvironmentConfig(type="openenv", openenv=openenv), task, 256)
    prompt = task.train_prompt(0)
    try:
        _, response, mask = reference_episode(episodes, task, prompt)
    finally:
        episodes.environment.close()
    text = task.tokenizer.hf.decode(response)
    assert text.count("<tool_call>") == 2 and text.endswith(prompt.metadata["answer"] + "<eos>")
    masked = "".join(task.tokenizer.hf.decode([t]) for t, m in zip(response, mask) if m == 0)
    assert masked.startswith("<tool>") and masked.count("<assistant>") == 2
