"""Held-out evaluations run by a rollout replica (`learner.eval_by: replica`) while the learner trains.

The learner asks the controller for its replicas (`GetStatus`), takes a live one that holds the newest
weights (one that answered the controller at its address first), and sends it the task's held-out prompts
through the replica's `Generate` RPC, greedy, in chunks of at most `rollout.engine.max_batch_size` prompts;
it scores the responses with the task's own reward, as `greedy_accuracy` does on the learner. The replica
generates with whatever weights it holds: a push that lands meanwhile is taken mid-evaluation, so the result
names the weight versions its tokens came from.

`BackgroundEvaluations` runs one such evaluation at a time on a thread of its own; the loop takes the result
between steps, and an evaluation that could not run (no live replica, an RPC error) comes back as an error for
the loop to run on the learner instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

from asyncrl.core.runtime.one_at_a_time import OneAtATime
from asyncrl.core.tasks.evaluate import greedy_rewards
from asyncrl.v1 import controller_pb2, rollout_pb2, rollout_pb2_grpc


class NoReplica(RuntimeError):
    """No live replica to evaluate on."""


@dataclass(frozen=True)
class ReplicaEvaluation:
    accuracy: float
    replica_id: str
    versions: tuple[int, int]
    """The lowest and highest weight version of the evaluated tokens."""


class ReplicaEvaluator:
    def __init__(self, controller_stub, dial, task, max_new_tokens: int, max_prompts: int, timeout_s: float,
                 episodes=None, prompts=None, score=None):
        """`episodes` (multi-turn runs): the evaluation plays greedy episodes, one Generate call per round.
        `prompts`: the held-out prompts evaluated (None: the task's whole held-out set). `score`: how the
        responses are scored (`greedy_rewards`)."""
        self.episodes, self.prompts, self.score = episodes, prompts, score
        self.controller = controller_stub
        self.dial = dial
        """address -> a gRPC channel that carries the run's token (and TLS)."""
        self.task, self.max_new_tokens, self.max_prompts, self.timeout_s = task, max_new_tokens, max_prompts, timeout_s

    def pick(self) -> controller_pb2.ReplicaStatus:
        """A live replica with the newest weights: one the controller has reached at its address first, then the
        one holding the fewest leases."""
        status = self.controller.GetStatus(controller_pb2.GetStatusRequest(), timeout=self.timeout_s)
        live = [r for r in status.replicas if r.alive and r.address and not r.needs_sync]
        if not live:
            raise NoReplica("no live replica with current weights")
        return max(live, key=lambda r: (r.reachable, r.weight_version, -r.active_leases))

    def evaluate(self) -> ReplicaEvaluation:
        replica = self.pick()
        versions: list[int] = []
        channel = self.dial(replica.address)
        try:
            stub = rollout_pb2_grpc.RolloutStub(channel)

            def generate(prompts, params, n):
                groups = []
                for i in range(0, len(prompts), self.max_prompts):
                    request = rollout_pb2.GenerateRequest(
                        prompts=[rollout_pb2.PromptTokens(token_ids=p) for p in prompts[i : i + self.max_prompts]],
                        max_new_tokens=params.max_new_tokens, temperature=0.0)
                    reply = stub.Generate(request, timeout=self.timeout_s)
                    for sequence in reply.sequences:
                        versions.extend(sequence.weight_version)
                        groups.append([sequence])
                return groups

            rewards = greedy_rewards(generate, self.task, self.prompts, self.max_new_tokens, self.episodes,
                                     self.score)
        finally:
            channel.close()
        span = (min(versions), max(versions)) if versions else (replica.weight_version, replica.weight_version)
        return ReplicaEvaluation(sum(rewards) / len(rewards), replica.replica_id, span)


@dataclass(frozen=True)
class FinishedEvaluation:
    step: int
    version: int
    """The learner's step and version when the evaluation was asked for."""
    seconds: float
    result: ReplicaEvaluation | None
    error: str = ""
    """Why it did not run (result None)."""


class BackgroundEvaluations:
    """One evaluation on a replica at a time, on a thread of its own."""

    def __init__(self, evaluator: ReplicaEvaluator):
        self.evaluator = evaluator
        self._runs = OneAtATime("replica-eval")

    def start(self, step: int, version: int) -> bool:
        """Start an evaluation for `step`; False (nothing started) while the previous one still runs."""
        if self._runs.running:
            return False
        self._runs.start(self._run, step, version)
        return True

    def poll(self) -> FinishedEvaluation | None:
        """The evaluation that has finished since the last call, if any (never waits)."""
        return self._runs.poll()

    def wait(self) -> FinishedEvaluation | None:
        """Wait for the evaluation in flight, if any."""
        return self._runs.wait()

    def _run(self, step: int, version: int) -> FinishedEvaluation:
        t0 = time.perf_counter()
        try:
            result = self.evaluator.evaluate()
        except grpc.RpcError as err:
            why = f"{err.code().name}: {err.details()}"
        except Exception as err:  # noqa: BLE001 - whatever went wrong, the learner evaluates instead (and shows it)
            why = f"{type(err).__name__}: {err}"
        else:
            return FinishedEvaluation(step, version, time.perf_counter() - t0, result)
        return FinishedEvaluation(step, version, time.perf_counter() - t0, None, why)
