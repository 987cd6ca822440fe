"""Many episodes in flight over one `generate`: each round generates the model's turns of every episode that is
ready in one call, while the others wait on their environment calls, which run on worker threads beside it.

All of an episode's state changes on the caller's thread (`poll`); the workers only run the environment's
`start` and `step` and hand the answer back through a queue. A call past `step_timeout_s` ends its episode
(`timeout`) and its answer, if it ever comes, is ignored; so does a call whose environment gave up waiting itself
(it raised `TimeoutError`), whichever of the two comes first. A call that raises anything else or answers garbage
ends it (`environment_error`, logged once per distinct error). A call that never returns keeps its thread: once every
worker is kept so, `EnvironmentWorkersHung` is raised (the rollout replica exits and is restarted).
"""

from __future__ import annotations

import logging
import queue
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from asyncrl.core.agents.environment import Environment, checked, checked_messages
from asyncrl.core.agents.episode import (
    DONE,
    ENVIRONMENT_ERROR,
    MAX_TOKENS,
    MAX_TURNS,
    TIMEOUT,
    Episode,
    EpisodeResult,
)
from asyncrl.core.agents.render import TurnRenderer
from asyncrl.core.determinism.seeds import derive_seed
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.runtime.log_once import FirstOfKind

log = logging.getLogger(__name__)
_ERRORS = FirstOfKind()


class EnvironmentWorkersHung(RuntimeError):
    """Every environment worker is held by a call that ran past its time limit and never returned."""


@dataclass(frozen=True, kw_only=True)
class EpisodeLimits:
    max_turns: int
    max_episode_tokens: int
    step_timeout_s: float
    episode_timeout_s: float
    max_context: int
    """The model's context: a turn is only generated when the episode's tokens and a whole turn fit in it."""

    @classmethod
    def from_config(cls, env, max_context: int) -> EpisodeLimits:
        return cls(max_turns=env.max_turns, max_episode_tokens=env.max_episode_tokens,
                   step_timeout_s=env.step_timeout_s, episode_timeout_s=env.episode_timeout_s, max_context=max_context)


class RunnerHooks:
    """What the runner reports (no-ops here; the rollout's metrics override them)."""

    def generated(self, episodes: int, tokens: int, seconds: float) -> None:
        """One round's generation of `episodes` turns."""

    def environment_call(self, seconds: float) -> None:
        """One environment call answered."""

    def ended(self, result: EpisodeResult) -> None:
        """An episode ended."""


GenerateTurns = Callable[..., list]
"""(contexts, params[, seeds]) -> one `Generation` per context; `seeds` (one per context) only where the episodes
are seeded (`model.determinism`)."""


class EpisodeRunner:
    def __init__(self, *, environment: Environment, renderer: TurnRenderer, decode: Callable[[list[int]], str],
                 generate: GenerateTurns, params: SamplingParams, limits: EpisodeLimits, workers: int,
                 hooks: RunnerHooks | None = None):
        self.environment, self.renderer, self.decode = environment, renderer, decode
        self.generate, self.params, self.limits = generate, params, limits
        self.hooks = hooks or RunnerHooks()
        self._workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="environment")
        self._answers: queue.Queue[Future] = queue.Queue()
        self._waiting: dict[Future, tuple[Episode, Callable, float, float]] = {}
        """An environment call in flight -> (its episode, what to do with the answer, started, deadline)."""
        self._stuck: set[Future] = set()
        self._ready: list[Episode] = []
        self._finished: list[tuple[object, EpisodeResult]] = []
        self.in_flight = 0

    # -- the caller's side ------------------------------------------------------------------------------------
    def start(self, key, prompt, seed: int | None = None) -> None:
        """Begin an episode on `prompt`; `poll` returns it as (key, result) when it ends. With `seed` its turns
        are sampled from seeds derived from it (turn t: `derive_seed(seed, t)`)."""
        episode = Episode(key=key, prompt=prompt, context=self.renderer.first_context(prompt), session=None)
        episode.seed = seed
        self.in_flight += 1
        self._call(episode, lambda: self.environment.start(prompt), self._started)

    def poll(self, wait_s: float) -> list[tuple[object, EpisodeResult]]:
        """One round: take the environment's answers (waiting up to `wait_s` for one when no turn is ready),
        end the calls past their time limit, generate every ready turn in one call. Returns the episodes that
        ended."""
        self._take_answers(block_s=0.0)
        self._expire()
        if not self._ready and self._waiting:
            self._take_answers(block_s=min(wait_s, max(0.0, self._next_deadline() - time.monotonic())))
            self._expire()
        elif not self._ready and wait_s > 0:
            time.sleep(min(wait_s, 0.01))
        if self._ready:
            self._generate()
        finished, self._finished = self._finished, []
        return finished

    def run(self, prompts: list, keys: list | None = None) -> list[EpisodeResult]:
        """Every prompt's episode to its end, in order (evaluations, warm starts)."""
        keys = list(range(len(prompts))) if keys is None else keys
        for key, prompt in zip(keys, prompts):
            self.start(key, prompt)
        results = {}
        while self.in_flight:
            for key, result in self.poll(wait_s=0.05):
                results[key] = result
        return [results[key] for key in keys]

    def close(self) -> None:
        for episode in [waiting[0] for waiting in self._waiting.values()] + self._ready:
            self._close_session(episode)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- rounds -----------------------------------------------------------------------------------------------
    def _generate(self) -> None:
        ready, self._ready = self._ready, []
        now = time.monotonic()
        live = []
        for episode in ready:
            if now - episode.started > self.limits.episode_timeout_s:
                self._end(episode, TIMEOUT)
            else:
                live.append(episode)
        if not live:
            return
        started = time.perf_counter()
        contexts = [e.full_context() for e in live]
        if all(e.seed is not None for e in live):
            generations = self.generate(contexts, self.params, [derive_seed(e.seed, e.turns) for e in live])
        else:
            generations = self.generate(contexts, self.params)
        if len(generations) != len(live):
            raise RuntimeError(f"generate returned {len(generations)} turns for {len(live)} contexts")
        self.hooks.generated(len(live), sum(len(g.token_ids) for g in generations), time.perf_counter() - started)
        for episode, generation in zip(live, generations):
            whole = episode.add_turn(generation, self.limits.max_episode_tokens)
            if not whole or not episode.last_turn_finished:
                self._end(episode, MAX_TOKENS)  # cut mid-turn: no end-of-turn token for the template to follow
                continue
            turn_start = episode.observation_ends[-1] if episode.observation_ends else 0
            action = self.decode(episode.token_ids[turn_start:])
            session = episode.session
            self._call(episode, lambda s=session, a=action: s.step(a), self._stepped)

    def _started(self, episode: Episode, session) -> None:
        episode.session = session
        opening = checked_messages(session.opening, "start")
        if opening:  # the environment's first observation follows the prompt, before the model's first turn
            episode.context = self.renderer.first_context(episode.prompt, opening)
            if len(episode.context) + self.params.max_new_tokens > self.limits.max_context:
                return self._end(episode, MAX_TOKENS)
        self._ready.append(episode)
        return None

    def _stepped(self, episode: Episode, result) -> None:
        result = checked(result)
        episode.reward_turn(result.reward)
        episode.tools.extend(result.tools)
        if result.done:
            return self._end(episode, DONE)
        if episode.turns >= self.limits.max_turns:
            return self._end(episode, MAX_TURNS)
        observation = self.renderer.observation(result.messages)
        if not episode.add_observation(observation, self.limits.max_episode_tokens):
            return self._end(episode, MAX_TOKENS)
        if len(episode.context) + len(episode.token_ids) + self.params.max_new_tokens > self.limits.max_context:
            return self._end(episode, MAX_TOKENS)
        self._ready.append(episode)
        return None

    def _end(self, episode: Episode, reason: str) -> None:
        self.in_flight -= 1
        self._close_session(episode)
        result = episode.result(reason)
        self.hooks.ended(result)
        self._finished.append((episode.key, result))

    def _close_session(self, episode: Episode) -> None:
        if episode.session is not None:
            session, episode.session = episode.session, None
            self._pool.submit(_quietly, session.close)

    # -- environment calls ------------------------------------------------------------------------------------
    def _call(self, episode: Episode, fn: Callable, then: Callable) -> None:
        self._check_workers()
        future = self._pool.submit(fn)
        now = time.monotonic()
        self._waiting[future] = (episode, then, now, now + self.limits.step_timeout_s)
        future.add_done_callback(self._answers.put)

    def _take_answers(self, block_s: float) -> None:
        try:
            future = self._answers.get(timeout=block_s) if block_s > 0 else self._answers.get_nowait()
        except queue.Empty:
            return
        while True:
            self._answer(future)
            try:
                future = self._answers.get_nowait()
            except queue.Empty:
                return

    def _answer(self, future: Future) -> None:
        waiting = self._waiting.pop(future, None)
        if waiting is None:
            return  # its episode ended at the time limit: the late answer is dropped
        episode, then, started, _ = waiting
        elapsed = time.monotonic() - started
        episode.environment_s += elapsed
        self.hooks.environment_call(elapsed)
        try:
            then(episode, future.result())
        except TimeoutError:  # the environment's own time limit (a client's message time-out) ran out first
            self._end(episode, TIMEOUT)
        except Exception as err:  # noqa: BLE001 - the environment's failure ends its episode, never the run
            key = f"{type(err).__name__}: {err}"
            if _ERRORS.first(key):
                detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                log.error("environment call failed (its episode ends; logged once per distinct error): %s\n%s", key,
                          detail)
            self._end(episode, ENVIRONMENT_ERROR)

    def _expire(self) -> None:
        now = time.monotonic()
        for future, (episode, _, started, deadline) in list(self._waiting.items()):
            if now >= deadline:
                del self._waiting[future]
                if not future.cancel():
                    self._stuck.add(future)  # running: it holds its worker until it returns, if ever
                episode.environment_s += now - started
                self._end(episode, TIMEOUT)

    def _next_deadline(self) -> float:
        return min(deadline for *_, deadline in self._waiting.values())

    def _check_workers(self) -> None:
        self._stuck = {future for future in self._stuck if not future.done()}
        if len(self._stuck) >= self._workers:
            raise EnvironmentWorkersHung(
                f"all {self._workers} environment workers (environment.workers) are held by calls that ran past "
                f"environment.step_timeout_s ({self.limits.step_timeout_s:g} s) and never returned")


def _quietly(fn: Callable) -> None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - closing a session is best effort
        log.warning("closing an environment session: %s: %s", type(err).__name__, err)
