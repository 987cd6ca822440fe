"""Multi-turn episodes, the pure parts and the runner over a scripted generate: tool-call parsing, episode
assembly and masks, observation rendering with chat templates, the runner's limits and faults, and token in,
token out (the model's ids reach the trajectory as sampled)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from asyncrl.core.agents.environment import Environment, Session, StepResult, ToolOutcome
from asyncrl.core.agents.episode import (
    DONE,
    ENVIRONMENT_ERROR,
    MAX_TOKENS,
    MAX_TURNS,
    TIMEOUT,
    Episode,
    EpisodeResult,
)
from asyncrl.core.agents.reference import reference_episode
from asyncrl.core.agents.render import TurnRenderer
from asyncrl.core.agents.runner import EnvironmentWorkersHung, EpisodeLimits, EpisodeRunner
from asyncrl.core.agents.tool_calls import ToolCall, parse_tool_calls
from asyncrl.core.agents.tool_env import ToolEnvironment
from asyncrl.core.agents.tools import load_tools
from asyncrl.core.buffer.trajectory_checks import BadGroup, TrajectoryLimits, check_trajectory_group
from asyncrl.core.engines.base import Generation
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks.base import Prompt
from asyncrl.learner.batch import assemble, staleness_stats, trained_width
from asyncrl.rollout.trajectories import build_group

ROOT = Path(__file__).resolve().parents[2]
ADD = f"{ROOT}/examples/agent/tools.py:add"
CALL = '<tool_call>{"name":"add","arguments":{"a":%d,"b":%d}}</tool_call>'


# -- tool calls ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, calls", [
    ("46", []),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', [ToolCall("add", {"a": 1, "b": 2})]),
    ('<tool_call>{"name":"add","arguments":"{\\"a\\": 1}"}</tool_call>', [ToolCall("add", {"a": 1})]),
    ('x<tool_call>{"name":"a"}</tool_call><tool_call>{"name":"b","arguments":{}}</tool_call>',
     [ToolCall("a", {}), ToolCall("b", {})]),
    ("<tool_call>{not json}</tool_call>", ["not JSON"]),
    ('<tool_call>["add"]</tool_call>', ['string "name"']),
    ('<tool_call>{"name":"add","arguments":[1]}</tool_call>', ['"arguments" must be a JSON object']),
    ('<tool_call>{"name":"add"', ["not closed"]),
])
def test_tool_calls_are_parsed_and_malformed_ones_carry_their_error(text, calls):
    check_calls(parse_tool_calls(text), calls)


def check_calls(got, calls):
    assert len(got) == len(calls), got
    for call, want in zip(got, calls):
        if isinstance(want, str):
            assert want in call.error
        else:
            assert call == want


@pytest.mark.parametrize("call_format, text, calls", [
    ("mistral", "46", []),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', [ToolCall("add", {"a": 1, "b": 2})]),
    ("mistral", '[TOOL_CALLS] [{"name":"a","arguments":{}}, {"name":"b","arguments":"{\\"x\\": 1}"}]',
     [ToolCall("a", {}), ToolCall("b", {"x": 1})]),
    ("mistral", "[TOOL_CALLS]{not json", ["not JSON"]),
    ("mistral", "[TOOL_CALLS][]", ["non-empty JSON array"]),
    ("mistral", '[TOOL_CALLS][{"arguments": {}}]', ['string "name"']),
    ("llama3_json", "The sum is 46.", []),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}', [ToolCall("add", {"a": 1, "b": 2})]),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}',
     [ToolCall("a", {}), ToolCall("b", {"y": 2})]),
    ("llama3_json", '{"name": "add", "parameters": [1]}', ['"parameters" must be a JSON object']),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1}', ["not JSON"]),
    ("llama3_json", '{"name": "a", "parameters": {}}; oops', [ToolCall("a", {}), "not JSON"]),
])
def test_the_mistral_and_llama3_json_formats_parse_as_their_templates_write_them(call_format, text, calls):
    check_calls(parse_tool_calls(text, call_format), calls)


def test_the_tool_environment_reads_the_configured_format():
    env = ToolEnvironment(load_tools([ADD]), exact, call_format="llama3_json")
    session = env.start(Prompt(text="1+2=", token_ids=[1], metadata={"answer": "3"}))
    step = session.step('{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert step.messages == [{"role": "tool", "content": "3"}] and not step.done
    assert session.step("3").reward == 1.0


def test_tools_load_with_their_schema_and_bad_ones_are_named(tmp_path):
    tools = load_tools([ADD])
    assert tools["add"].schema["function"]["parameters"]["required"] == ["a", "b"]
    (tmp_path / "t.py").write_text("def f(a, b):\n    return a\n")
    with pytest.raises(ValueError, match="no JSON schema"):
        load_tools([f"{tmp_path}/t.py:f"])
    with pytest.raises(ValueError, match="second tool named 'add'"):
        load_tools([ADD, ADD])


def test_the_tool_environment_answers_calls_errors_and_the_final_answer():
    env = ToolEnvironment(load_tools([ADD]), lambda text, meta: float(text == meta["answer"]))
    session = env.start(Prompt(text="1+2=", token_ids=[1], metadata={"answer": "3"}))
    step = session.step(CALL % (1, 2))
    assert step.messages == [{"role": "tool", "content": "3"}] and not step.done and step.tools[0].ok
    bad = session.step('<tool_call>{"name":"mul","arguments":{}}</tool_call><tool_call>{"name":"add","arguments":{"a":1}}</tool_call>')
    assert [m["content"][:6] for m in bad.messages] == ["error:", "error:"]
    assert [(t.tool, t.ok) for t in bad.tools] == [("<invalid>", False), ("add", False)]
    assert "missing a required argument: 'b'" in bad.messages[1]["content"]
    final = session.step("3")
    assert final.done and final.reward == 1.0 and final.messages == []


# -- episode assembly ------------------------------------------------------------------------------------------
def gen(ids, version, finished=True):
    return Generation(token_ids=list(ids), logp_behav=[-0.5] * len(ids), weight_version=[version] * len(ids),
                      finished=finished)


def test_an_episode_interleaves_turns_and_observations_with_masks_versions_and_rewards():
    episode = Episode(key=0, prompt=None, context=[1, 2], session=None)
    assert episode.add_turn(gen([10, 11, 2], version=3), max_tokens=100)
    assert episode.add_observation([20, 21], max_tokens=100)
    episode.reward_turn(0.25)
    assert episode.add_turn(gen([12, 2], version=4), max_tokens=100)
    episode.reward_turn(1.0)
    result = episode.result(DONE)
    assert result.token_ids == [10, 11, 2, 20, 21, 12, 2]
    assert result.logp_behav == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert result.weight_version == [3, 3, 3, 3, 3, 4, 4]  # an observation carries the version before it
    assert (result.observation_starts, result.observation_ends, result.turn_ends) == ([3], [5], [3, 7])
    assert result.turn_rewards == [0.25, 1.0] and result.reward == 1.25 and result.finished
    assert result.model_tokens == 5
    cut = episode.result(TIMEOUT)
    assert cut.reward == 0.0 and cut.turn_rewards == [0.0, 0.0] and not cut.finished


def test_an_episode_stops_at_its_token_limit():
    episode = Episode(key=0, prompt=None, context=[1], session=None)
    assert not episode.add_turn(gen([5] * 8, version=0), max_tokens=6)
    assert len(episode.token_ids) == 6 and episode.turn_ends == [6] and not episode.last_turn_finished
    assert not episode.add_observation([7], max_tokens=6) and len(episode.token_ids) == 6


def written(results: list[EpisodeResult], prompt=(1, 2)):
    return build_group(group_id="r-l1", prompt_index=0, prompt_token_ids=list(prompt), generations=results,
                       rewards=[r.reward for r in results], replica_id="r", lease_id="l1", metadata={})


def test_the_learner_trains_only_the_model_tokens_of_an_episode():
    a = Episode(key=0, prompt=None, context=[1, 2], session=None)
    a.add_turn(gen([10, 11, 2], version=1), 100)
    a.add_observation([20, 21, 22], 100)
    a.reward_turn(0.0)
    a.add_turn(gen([12, 2], version=2), 100)
    a.reward_turn(1.0)
    b = Episode(key=1, prompt=None, context=[1, 2], session=None)
    b.add_turn(gen([13, 2], version=2), 100)
    b.reward_turn(0.0)
    group = written([a.result(DONE), b.result(DONE)])
    check_trajectory_group(group, TrajectoryLimits(64, 64, 16, 2, 10.0))
    from asyncrl.core.buffer import BufferEntry

    batch = assemble([BufferEntry(entry_id="1-0", group=group)])
    assert batch.response_mask.tolist() == [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.turns.tolist() == [2, 1] and batch.observation_tokens.tolist() == [3, 0]
    assert trained_width(batch.response_mask) == 8
    assert batch.rows([1]).response_mask.shape[1] == 2
    # Staleness counts the model's tokens: the observation's version never makes a trajectory look older.
    assert staleness_stats(batch, version=2)["staleness/max"] == 1


def test_where_a_batchs_episode_time_went_and_how_its_tool_calls_fared():
    """Hand-computed: 3 s of environment calls in 10 s of episodes and 1 s in 2 s -> 4/12 of the time; 12 s
    over 2 episodes; 3 calls, 1 failed; episodes of 7 and 2 tokens; the trajectory carries each episode's own
    figures."""
    a = Episode(key=0, prompt=None, context=[1, 2], session=None)
    a.add_turn(gen([10, 11, 2], version=1), 100)
    a.add_observation([20, 21], 100)
    a.add_turn(gen([12, 2], version=1), 100)
    a.tools.extend([ToolOutcome("add", True), ToolOutcome("add", False)])
    a.environment_s = 3.0
    b = Episode(key=1, prompt=None, context=[1, 2], session=None)
    b.add_turn(gen([13, 2], version=1), 100)
    b.tools.append(ToolOutcome("add", True))
    b.environment_s = 1.0
    ra, rb = a.result(DONE), b.result(DONE)
    ra.seconds, rb.seconds = 10.0, 2.0
    group = written([ra, rb])
    t = group.trajectories[0]
    assert (t.environment_seconds, t.episode_seconds, t.tool_calls, t.tool_failures) == (3.0, 10.0, 2, 1)
    from asyncrl.core.buffer import BufferEntry

    figures = assemble([BufferEntry(entry_id="1-0", group=group)]).episode_figures
    assert figures == pytest.approx({"episode/environment_share": 4 / 12, "episode/seconds_mean": 6.0,
                                     "episode/tool_calls_mean": 1.5, "episode/tool_failure_frac": 1 / 3,
                                     # 7 and 2 response tokens: linear interpolation between them
                                     "episode/tokens_p50": 4.5, "episode/tokens_p90": 6.5, "episode/tokens_max": 7.0})


@pytest.mark.parametrize("field, value, message", [
    ("observation_starts", [0], "observation spans"),
    ("observation_ends", [9], "observation spans"),
    ("turn_ends", [2, 7], "turn ends at 2"),
    ("turn_ends", [], "turn_ends must increase"),
    ("turn_rewards", [0.5], "one finite value per turn"),
    ("turn_rewards", [0.5, 0.0], "sum to 0.5"),
    ("end_reason", "bored", "end_reason"),
    ("environment_seconds", -1.0, "environment_seconds and episode_seconds must be in"),
    ("episode_seconds", float("nan"), "environment_seconds and episode_seconds must be in"),
    ("tool_failures", 3, r"tool_failures must be in \[0, tool_calls = 0\]"),
])
def test_malformed_episode_fields_are_refused_naming_the_field(field, value, message):
    a = Episode(key=0, prompt=None, context=[1, 2], session=None)
    a.add_turn(gen([10, 11, 2], version=1), 100)
    a.add_observation([20, 21], 100)
    a.reward_turn(0.0)
    a.add_turn(gen([12, 2], version=1), 100)
    a.reward_turn(1.0)
    group = written([a.result(DONE)])
    t = group.trajectories[0]
    if isinstance(value, (str, int, float)):
        setattr(t, field, value)
    else:
        getattr(t, field)[:] = value
    with pytest.raises(BadGroup, match=message):
        check_trajectory_group(group, TrajectoryLimits(64, 64, 16, 1, 10.0))


# -- rendering -------------------------------------------------------------------------------------------------
def test_observations_render_as_the_chat_template_continues_a_conversation():
    chars = ModelTokenizer.chat_chars()
    renderer = TurnRenderer(chars)
    assert chars.hf.decode(renderer.observation([{"role": "tool", "content": "46"}])) == "<tool>46<assistant>"
    bpe = ModelTokenizer.load(ROOT / "examples/word_problems/tokenizer")
    renderer = TurnRenderer(bpe, load_tools([ADD])["add"].schema and [load_tools([ADD])["add"].schema])
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    tool = {"role": "tool", "content": "7"}
    whole = bpe.render_chat([*messages, tool], renderer.tools, add_generation_prompt=True)
    before = bpe.render_chat(messages, renderer.tools, add_generation_prompt=False)
    end = max(i for i, t in enumerate(before) if t in bpe.eos_ids)
    # A turn the engine ended at its end-of-turn token, then the observation: the whole conversation.
    assert before[: end + 1] + renderer.observation([tool]) == whole


# -- the runner ------------------------------------------------------------------------------------------------
class Scripted:
    """A generate that plays each episode's scripted turns (a turn per call), recording the batches."""

    def __init__(self, tokenizer, turns: dict, version=lambda: 0):
        self.tokenizer, self.turns, self.version = tokenizer, turns, version
        self.batches: list[int] = []
        self.calls: list = []
        self.sampled: dict = {}

    def __call__(self, contexts, params):
        self.batches.append(len(contexts))
        out = []
        for context in contexts:
            key = context[2]  # the prompts below differ in their third token
            self.calls.append(key)
            turn = self.turns[key].pop(0)
            ids = turn if isinstance(turn, list) else self.tokenizer.encode_text(turn) + [self.tokenizer.eos_id]
            self.sampled.setdefault(key, []).append(ids)
            out.append(Generation(token_ids=ids, logp_behav=[-0.1] * len(ids),
                                  weight_version=[self.version()] * len(ids), finished=True))
        return out


def runner_for(env, generate, tokenizer, **limits):
    base = {"max_turns": 4, "max_episode_tokens": 200, "step_timeout_s": 2.0, "episode_timeout_s": 30.0,
            "max_context": 256}
    return EpisodeRunner(environment=env, renderer=TurnRenderer(tokenizer, env.tools), decode=tokenizer.decode_response,
                         generate=generate, params=SamplingParams(max_new_tokens=64), workers=4,
                         limits=EpisodeLimits(**{**base, **limits}))


def sums(tokenizer, *pairs):
    prompts = []
    for a, b in pairs:
        messages = [{"role": "user", "content": f"{a}+{b}="}]
        prompts.append(Prompt(text=messages, token_ids=tokenizer.encode_prompt(messages),
                              metadata={"answer": str(a + b)}))
    return prompts


def exact(text, meta):
    return float(text == meta["answer"])


def test_episodes_run_to_their_reward_and_a_slow_tool_does_not_hold_up_the_others(tmp_path):
    chars = ModelTokenizer.chat_chars()
    (tmp_path / "slow.py").write_text(
        "import time\n\ndef add(a: int, b: int) -> int:\n    \"\"\"Add.\n\n    Args:\n        a: x\n        b: y\n"
        "    \"\"\"\n    if a == 9:\n        time.sleep(0.6)\n    return a + b\n")
    env = ToolEnvironment(load_tools([f"{tmp_path}/slow.py:add"]), exact)
    prompts = sums(chars, (1, 2), (9, 3))
    keys = [p.token_ids[2] for p in prompts]
    script = Scripted(chars, {keys[0]: [CALL % (1, 2), CALL % (3, 0), CALL % (3, 0), "3"],
                              keys[1]: [CALL % (9, 3), "12"]})
    runner = runner_for(env, script, chars)
    results = runner.run(prompts)
    runner.close()
    assert [(r.end_reason, r.reward, len(r.turn_ends)) for r in results] == [(DONE, 1.0, 4), (DONE, 1.0, 2)]
    # Episode 0 plays all its turns while episode 1 waits on its slow tool call.
    calls = script.calls
    assert calls.index(keys[1], calls.index(keys[1]) + 1) > max(i for i, k in enumerate(calls) if k == keys[0])
    assert results[1].environment_s >= 0.6


def test_token_in_token_out_on_a_tokenizer_where_a_round_trip_changes_the_ids():
    bpe = ModelTokenizer.load(ROOT / "examples/word_problems/tokenizer")
    env = ToolEnvironment(load_tools([ADD]), lambda text, meta: 1.0)
    prompt = sums(bpe, (4, 5))[0]
    text = "the answer"
    canonical = bpe.encode_text(text)
    # The same text, sampled one character at a time: a decode and re-encode would merge it back.
    sampled = [i for ch in text for i in bpe.encode_text(ch)] + [bpe.eos_id]
    assert bpe.encode_text(bpe.decode_response(sampled)) == canonical != sampled[:-1]
    key = TurnRenderer(bpe, env.tools).first_context(prompt)[2]
    script = Scripted(bpe, {key: [sampled]})
    runner = runner_for(env, script, bpe)
    (result,) = runner.run([prompt])
    runner.close()
    assert result.token_ids == sampled and result.end_reason == DONE
    group = written([result], prompt=TurnRenderer(bpe, env.tools).first_context(prompt))
    assert list(group.trajectories[0].response_token_ids) == sampled


class Faulty(Environment):
    def __init__(self, kind):
        self.kind = kind
        self.released = threading.Event()

    def start(self, prompt):
        if self.kind == "start_raises":
            raise ConnectionError("environment server gone")
        return FaultySession(self)


class FaultySession(Session):
    def __init__(self, env):
        self.env = env

    def step(self, action):
        kind = self.env.kind
        if kind == "hang":
            self.env.released.wait(30)
        if kind == "raises":
            raise RuntimeError("boom")
        if kind == "gives_up":  # the environment's own client timed out before the runner's limit
            raise TimeoutError
        if kind == "garbage":
            return {"observation": "not a StepResult"}
        if kind == "nan":
            return StepResult(messages=[], reward=float("nan"), done=True)
        return StepResult(messages=[{"role": "tool", "content": "1"}])


@pytest.mark.parametrize("kind, reason", [
    ("start_raises", ENVIRONMENT_ERROR), ("raises", ENVIRONMENT_ERROR), ("garbage", ENVIRONMENT_ERROR),
    ("nan", ENVIRONMENT_ERROR), ("hang", TIMEOUT), ("gives_up", TIMEOUT), ("forever", MAX_TURNS),
])
def test_an_environment_that_fails_ends_its_episode_with_the_reason(kind, reason):
    chars = ModelTokenizer.chat_chars()
    env = Faulty(kind)
    prompt = sums(chars, (1, 1))[0]
    script = Scripted(chars, {prompt.token_ids[2]: [CALL % (1, 1)] * 5})
    runner = runner_for(env, script, chars, step_timeout_s=0.3, max_turns=3)
    started = time.monotonic()
    (result,) = runner.run([prompt])
    env.released.set()
    runner.close()
    assert result.end_reason == reason and result.reward == 0.0
    assert time.monotonic() - started < 5


def test_episode_token_and_context_limits_end_episodes():
    chars = ModelTokenizer.chat_chars()
    env = ToolEnvironment(load_tools([ADD]), exact)
    prompt = sums(chars, (1, 1))[0]
    long_turns = {prompt.token_ids[2]: [CALL % (1, 1)] * 5}
    runner = runner_for(env, Scripted(chars, dict(long_turns)), chars, max_episode_tokens=60)
    (result,) = runner.run([prompt])
    assert result.end_reason == MAX_TOKENS and len(result.token_ids) <= 60
    runner = runner_for(env, Scripted(chars, {prompt.token_ids[2]: [CALL % (1, 1)] * 5}), chars, max_context=100)
    (result,) = runner.run([prompt])
    assert result.end_reason == MAX_TOKENS and len(result.turn_ends) == 1


def test_a_turn_cut_before_its_end_of_turn_token_ends_the_episode():
    chars = ModelTokenizer.chat_chars()
    env = ToolEnvironment(load_tools([ADD]), exact)
    prompt = sums(chars, (1, 1))[0]

    def cut(contexts, params):
        return [Generation(token_ids=[20, 21], logp_behav=[-1.0, -1.0], weight_version=[0, 0], finished=False)]

    runner = runner_for(env, cut, chars)
    (result,) = runner.run([prompt])
    assert result.end_reason == MAX_TOKENS and result.token_ids == [20, 21]


def test_every_worker_held_by_a_hung_call_is_reported():
    chars = ModelTokenizer.chat_chars()
    env = Faulty("hang")
    prompts = sums(chars, (1, 1), (2, 2))
    script = Scripted(chars, {p.token_ids[2]: [CALL % (1, 1)] for p in prompts})
    runner = EpisodeRunner(environment=env, renderer=TurnRenderer(chars), decode=chars.decode_response,
                           generate=script, params=SamplingParams(max_new_tokens=64), workers=2,
                           limits=EpisodeLimits(max_turns=4, max_episode_tokens=200, step_timeout_s=0.2,
                                                episode_timeout_s=30, max_context=256))
    results = runner.run(prompts)
    assert [r.end_reason for r in results] == [TIMEOUT, TIMEOUT]
    with pytest.raises(EnvironmentWorkersHung, match="environment.workers"):
        runner.start("third", prompts[0])
    env.released.set()
    runner.close()


def test_a_weight_push_between_turns_shows_in_the_episodes_versions():
    chars = ModelTokenizer.chat_chars()
    env = ToolEnvironment(load_tools([ADD]), exact)
    prompt = sums(chars, (2, 3))[0]
    version = iter([4, 5])
    script = Scripted(chars, {prompt.token_ids[2]: [CALL % (2, 3), "5"]}, version=lambda: next(version))
    runner = runner_for(env, script, chars)
    (result,) = runner.run([prompt])
    runner.close()
    first = result.turn_ends[0]
    assert set(result.weight_version[:first]) == {4} and result.weight_version[-1] == 5 and result.reward == 1.0


def test_a_reference_episode_plays_the_target_turns_against_the_environment():
    from asyncrl.core.agents.factory import Episodes
    from asyncrl.core.config.data import TaskConfig
    from asyncrl.core.config.environment import EnvironmentConfig
    from asyncrl.core.tasks import get_task

    task = get_task(TaskConfig(name="tool_sum", num_digits=2, num_terms=3, eval_size=10))
    episodes = Episodes.for_task(EnvironmentConfig(type="tools", tools=[ADD]), task, 256)
    prompt = task.train_prompt(0)
    _, response, mask = reference_episode(episodes, task, prompt)
    text = task.tokenizer.hf.decode(response)
    assert text.count("<tool_call>") == 2 and text.endswith(prompt.metadata["answer"] + "<eos>")
    masked = "".join(task.tokenizer.hf.decode([t]) for t, m in zip(response, mask) if m == 0)
    assert masked.startswith("<tool>") and masked.count("<assistant>") == 2
    assert torch.tensor(mask).sum() < len(mask)


class Opening(Environment):
    """An environment whose reset shows a message before the model's first turn (as an OpenEnv server's reset
    observation does); `opening` garbage is a fault."""

    def __init__(self, opening):
        self.opening = opening

    def start(self, prompt):
        session = Answering()
        session.opening = self.opening
        return session


class Answering(Session):
    def step(self, action):
        return StepResult(messages=[], reward=float(action == "3"), done=True)


def test_an_environments_opening_follows_the_prompt_and_is_the_trajectorys_prompt():
    """The opening messages are rendered after the prompt by the chat template, before the model's first turn;
    the episode's context (what the engine saw) is the trajectory's prompt, not the task's prompt alone."""
    chars = ModelTokenizer.chat_chars()
    prompt = sums(chars, (1, 2))[0]
    script = Scripted(chars, {prompt.token_ids[2]: ["3"]})
    runner = runner_for(Opening([{"role": "user", "content": "numbers 1 2"}]), script, chars)
    (result,) = runner.run([prompt])
    runner.close()
    assert (result.end_reason, result.reward) == (DONE, 1.0)
    assert result.context == chars.render_chat([*prompt.text, {"role": "user", "content": "numbers 1 2"}],
                                               add_generation_prompt=True)
    assert result.context[:len(prompt.token_ids) - 1] == list(prompt.token_ids)[:-1]  # the prompt, then the opening
    group = build_group(group_id="r-l1", prompt_index=0, prompt_token_ids=list(prompt.token_ids),
                        generations=[result], rewards=[result.reward], replica_id="r", lease_id="l1", metadata={})
    assert list(group.trajectories[0].prompt_token_ids) == result.context
    assert chars.hf.decode(result.context).endswith("<user>numbers 1 2<assistant>")


@pytest.mark.parametrize("opening", [[{"role": "user"}], "numbers", [{"role": "user", "content": 3}]])
def test_a_malformed_opening_ends_the_episode_as_an_environment_error(opening):
    chars = ModelTokenizer.chat_chars()
    prompt = sums(chars, (1, 2))[0]
    runner = runner_for(Opening(opening), Scripted(chars, {prompt.token_ids[2]: ["3"]}), chars)
    (result,) = runner.run([prompt])
    runner.close()
    assert (result.end_reason, result.reward) == (ENVIRONMENT_ERROR, 0.0)


def test_every_tool_call_format_the_config_accepts_has_a_parser():
    from typing import get_args

    from asyncrl.core.agents.tool_calls import FORMATS
    from asyncrl.core.config.environment import EnvironmentConfig

    assert set(get_args(EnvironmentConfig.model_fields["tool_call_format"].annotation)) == set(FORMATS)
