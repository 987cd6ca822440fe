"""The rollout loop of a replica whose samples are multi-turn episodes (`environment.type` set; docs/agents.md).

It keeps up to `episodes_in_flight` episodes going: a lease request (held by the controller while the staleness
bound forbids it) runs in the background while episodes play; each lease starts G episodes of its prompt; every
round generates the model's turns of the episodes that are ready in one engine call while the others wait on
the environment (`asyncrl.core.agents.runner`). A group is finished (rewards from its episodes, teacher
annotation, checks, write, completion) on the finisher thread, as the single-turn loop does, as soon as its G
episodes have ended. A weight push lands between rounds, so an episode goes on with the new weights from its
next turn and its tokens record both versions.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from asyncrl.core.agents.factory import turns_of
from asyncrl.core.agents.runner import RunnerHooks
from asyncrl.core.determinism.seeds import sample_seed
from asyncrl.rollout.subgroups import lease_size
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.v1 import controller_pb2

ROUND_WAIT_S = 0.05
"""How long a round waits for an environment answer when no turn is ready."""


@dataclass
class GroupInPlay:
    lease: object
    prompt: object
    size: int
    """Its episodes (the lease's trajectories)."""
    results: dict = field(default_factory=dict)
    """Sample index -> its EpisodeResult."""


class ReplicaHooks(RunnerHooks):
    def __init__(self, metrics):
        self.metrics = metrics

    def generated(self, episodes: int, tokens: int, seconds: float) -> None:
        self.metrics.generation_seconds.observe(seconds)
        self.metrics.tokens_generated.inc(tokens)

    def environment_call(self, seconds: float) -> None:
        self.metrics.environment_seconds.observe(seconds)

    def ended(self, result) -> None:
        self.metrics.episode_ended(result)


class EpisodeWorker(RolloutWorker):
    def __init__(self, *, episodes, episodes_in_flight: int, **kwargs):
        """`episodes`: the run's `Episodes`; `episodes_in_flight`: how many this replica keeps going."""
        super().__init__(**kwargs)
        self.capacity = max(episodes_in_flight, self.group_size)
        self.runner = episodes.runner(turns_of(self._generate), self.params, self.capacity, ReplicaHooks(self.metrics))
        self.groups: dict[str, GroupInPlay] = {}
        self._finishing: list = []
        """The finisher's work on groups handed over, until it is done."""

    def _generate(self, prompts, params, n, seeds=None):
        with self.engine_lock:
            return self.engine.generate(prompts, params, n=n, seeds=seeds)

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")
        try:
            if self.annotator is not None:
                self.annotator.wait_ready(stop)
            self._play(stop)
        finally:
            self._finisher.shutdown(wait=True)
            self.runner.close()

    def _play(self, stop: threading.Event) -> None:
        asking = None  # the lease request in flight
        asked_at = 0.0
        while not stop.is_set():
            room = self.capacity - self.runner.in_flight
            if asking is None and room >= self.group_size:
                asking, asked_at = self._ask(room // self.group_size), time.perf_counter()
            if asking is not None and asking.done():
                self._take(asking, asked_at, stop)
                asking = None
            finished = self.runner.poll(ROUND_WAIT_S)
            self.metrics.episodes_in_flight.set(self.runner.in_flight)
            self._collect(finished)
            self._check_finishing()
        if asking is not None:
            asking.cancel()
        for future in self._finishing:
            future.result()

    def _check_finishing(self) -> None:
        """Raise what a finished group's work raised (a hung reward pool ends the loop, as in the single-turn
        loop); forget the groups done."""
        for future in [f for f in self._finishing if f.done()]:
            self._finishing.remove(future)
            future.result()

    def _ask(self, groups: int):
        request = controller_pb2.AcquireLeasesRequest(
            replica_id=self.session.replica_id, num_trajectories=self.group_size, wait_s=self.hold_s,
            max_leases=min(groups, self.leases_per_batch))
        return self.stub.AcquireLeases.future(request, timeout=self.hold_s + 30)

    def _take(self, asking, asked_at: float, stop: threading.Event) -> None:
        """Start G episodes per lease granted; a failed request is logged (and the replica registered again
        when the controller no longer knows it)."""
        try:
            answer = asking.result()
        except grpc.FutureCancelledError:
            return
        except grpc.RpcError as err:
            self._controller_failed(err, stop)
            return
        self.metrics.lease_wait.observe(time.perf_counter() - asked_at)
        for lease in answer.leases:
            self.session.held.add(lease.lease_id)
            prompt = self._prompt(lease)
            size = lease_size(lease, self.group_size)
            self.groups[lease.lease_id] = GroupInPlay(lease, prompt, size)
            seed = self._seed(lease)
            for sample in range(size):
                self.runner.start((lease.lease_id, sample), prompt,
                                  None if seed is None else sample_seed(seed, sample))

    def _collect(self, finished: list) -> None:
        """File each ended episode under its group; hand the groups whose G episodes all ended to the finisher."""
        done = []
        for (lease_id, sample), result in finished:
            group = self.groups[lease_id]
            group.results[sample] = result
            if len(group.results) == group.size:
                done.append(self.groups.pop(lease_id))
        if done:
            self._finishing.append(self._finisher.submit(self._finish, [g.lease for g in done], [g.prompt for g in done],
                                  [[g.results[j] for j in range(g.size)] for g in done]))

    def _rewards(self, prompt, gens) -> list[float]:
        """An episode's reward is its environment's (the sum of its turn rewards)."""
        return [g.reward for g in gens]
