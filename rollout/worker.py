"""The rollout loop of one replica: lease -> generate -> reward -> write -> complete.

Each iteration asks for up to `leases_per_batch` leases in one AcquireLeases call (held while the staleness
bound forbids the first; the others only when admissible at once), generates all their groups in one engine
call, then hands them to the finisher thread, which scores them on the reward pool, writes one TrajectoryGroup
per lease to the buffer and completes the leases with what was written in one CompleteLeases call, while the
next batch generates. At most one batch waits to be finished, so leases stay short-lived. Two controller
calls per batch, whatever its size: the controller's work per trajectory shrinks with the batch. A replica
that has its groups annotated takes its first lease once the teacher answers (`TeacherAnnotator.wait_ready`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from asyncrl.core.buffer.trajectory_checks import BadGroup, TrajectoryLimits, check_trajectory_group
from asyncrl.core.config.schema import SamplingConfig
from asyncrl.core.determinism.seeds import prompt_seed
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.records.rollout import GroupRejected, GroupSkipped, GroupWritten, ProcessRewardsScored
from asyncrl.core.tasks.reward_pool import RewardWorkersHung
from asyncrl.rollout.subgroups import SubGroups, lease_size
from asyncrl.rollout.trajectories import build_group
from asyncrl.rollout.uniform_groups import is_uniform
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)
COMPLETE_ATTEMPTS = 4
COMPLETE_BACKOFF_S = 0.5
STOP_POLL_S = 0.1
"""How often a replica waiting on a held lease request looks whether it is stopping."""


def answer_unless_stopped(stop: threading.Event, call):
    """The answer of `call` (a gRPC future), or None when `stop` is set first: a lease request the controller
    holds (up to max_hold_s) is cancelled rather than waited for. Raises the call's RpcError."""
    answered = threading.Event()
    call.add_done_callback(lambda _call: answered.set())
    while not answered.wait(STOP_POLL_S):
        if stop.is_set() and call.cancel():  # not cancelled: answered meanwhile, leases and all
            return None
    return call.result()


class RolloutWorker:
    def __init__(self, *, sampling: SamplingConfig, leases_per_batch: int, hold_s: float, engine, engine_lock,
                 buffer, controller_stub, session, task, rewards, events, metrics, limits: TrajectoryLimits,
                 annotator=None, process_scorer=None, run_seed: int | None = None):  # fmt: skip
        """`leases_per_batch`: leases asked for at once (`rollout.leases_per_batch`); `hold_s`: how long a lease
        request may be held for admission (`controller.max_hold_s`); `run_seed`: seed every sample from it and
        its prompt's stream position (`model.determinism`); None: the engine's own generator."""
        self.run_seed = run_seed
        self.leases_per_batch = leases_per_batch
        self.hold_s = hold_s
        self.annotator = annotator
        """Fills each group's logp_teacher before it is written (`teacher.annotate_by: rollout`); None: not here."""
        self.process_scorer = process_scorer
        """Scores each response's process rewards before it is written (`rollout.process_rewards`); None: off."""
        self.engine = engine
        self.engine_lock = engine_lock
        self.buffer = buffer
        self.stub = controller_stub
        self.session = session
        self.task = task
        self.rewards = rewards
        """A `RewardPool` over the task's reward."""
        self.events = events
        self.metrics = metrics
        self.limits = limits
        """What a group must satisfy to be written (the rest goes to the dead-letter stream)."""
        self.params = SamplingParams.from_config(sampling)
        self.group_size = sampling.group_size
        self.drop_uniform = sampling.drop_uniform_groups
        """Groups whose rewards are all equal are not written (their quota returns)."""

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finish")
        self._pending = None
        try:
            if self.annotator is not None:
                self.annotator.wait_ready(stop)  # no lease before the teacher can annotate its groups
            self._loop(stop)
        finally:
            self._wait_finished()
            self._finisher.shutdown(wait=True)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except grpc.RpcError as err:
                self._controller_failed(err, stop)

    def _controller_failed(self, err: grpc.RpcError, stop: threading.Event) -> None:
        """A lease call failed: register again when the controller no longer knows this replica, else log it and
        retry after a second."""
        if err.code() == grpc.StatusCode.NOT_FOUND:
            self.session.register()
        else:
            log.warning("controller call failed (%s): %s; retrying", err.code().name, err.details())
            stop.wait(1.0)

    def _prompt(self, lease):
        """The prompt a lease asks for: its own, or its `sample_index` (a dropped group's prompt generated again,
        or a hard one sampled again: controller.difficulty)."""
        return self.task.train_prompt(lease.sample_index if lease.HasField("sample_index") else lease.prompt_index)

    def _seed(self, lease) -> int | None:
        """The sampling seed of a lease's prompt: from its position in the stream (the same position gets the
        same samples whichever replica plays it, and whenever)."""
        return None if self.run_seed is None else prompt_seed(self.run_seed, lease.prompt_index)

    def run_once(self) -> int:
        """One batch of leases; returns the number of groups written."""
        started = time.perf_counter()
        wait_s = self.hold_s
        answer = answer_unless_stopped(self._stop, self.stub.AcquireLeases.future(controller_pb2.AcquireLeasesRequest(
            replica_id=self.session.replica_id, num_trajectories=self.group_size, wait_s=wait_s,
            max_leases=self.leases_per_batch,
        ), timeout=wait_s + 30))  # fmt: skip
        if answer is None:
            return 0
        self.metrics.lease_wait.observe(time.perf_counter() - started)
        leases = list(answer.leases)
        if not leases:
            return 0
        for lease in leases:
            self.session.held.add(lease.lease_id)
        prompts = [self._prompt(lease) for lease in leases]
        parts = SubGroups(tuple(lease_size(lease, self.group_size) for lease in leases), self.group_size)
        gen_start = time.perf_counter()
        with self.engine_lock:
            seeds = None if self.run_seed is None else [self._seed(lease) for lease in leases]
            groups = parts.join(self.engine.generate(parts.requests([p.token_ids for p in prompts]), self.params,
                                                     n=self.group_size, seeds=parts.seeds(seeds)))
        gen_s = time.perf_counter() - gen_start
        tokens = sum(len(g.token_ids) for group in groups for g in group)
        self.metrics.generation_seconds.observe(gen_s)
        self.metrics.tokens_generated.inc(tokens)
        written = self._wait_finished()  # the previous batch; this one finishes while the next generates
        self._pending = self._finisher.submit(self._finish, leases, prompts, groups)
        return written

    def _wait_finished(self) -> int:
        pending, self._pending = self._pending, None
        return 0 if pending is None else pending.result()

    def _finish(self, leases, prompts, groups) -> int:
        """Score and build every group of the batch, set those with uniform rewards aside (when they are dropped),
        have the teacher annotate the rest in one call, check them, write the valid ones to the buffer in one
        round trip, record each write, then complete the leases in one call. Each lease settles on its own: one
        failure must not strand the others."""
        built = []
        for lease, prompt, gens in zip(leases, prompts, groups):
            try:
                built.append((lease, gens, *self._build(lease, prompt, gens)))
            except RewardWorkersHung:
                raise  # no reward can be computed any more: the loop dies, the replica is restarted
            except Exception as err:  # noqa: BLE001 - logged; the lease is given up (it expires, its quota returns)
                self._give_up(lease, err)
        # Not written, not annotated, their leases complete with nothing written: a group with an episode that
        # never reached the model's first turn (nothing of it to train; the group's advantages need all G),
        # and, when they are dropped, groups with uniform rewards.
        skipped = [(b, "environment_error") for b in built if any(not g.token_ids for g in b[1])]
        built = [b for b in built if all(g.token_ids for g in b[1])]
        if self.drop_uniform:
            skipped += [(b, "uniform") for b in built if is_uniform(b[3])]
            built = [b for b in built if not is_uniform(b[3])]
        if self.process_scorer is not None and built:
            self._score_process(built, prompts, leases)
        if self.annotator is not None:
            # Unannotated when the teacher does not answer: the learner asks for them itself.
            try:
                self.annotator.annotate([group for _, _, group, _ in built])
            except Exception as err:  # noqa: BLE001 - the groups go on unannotated
                log.warning("teacher annotation: %s: %s", type(err).__name__, err)
        prepared = []
        for lease, gens, group, rewards in built:
            try:
                prepared.append((lease, gens, self._checked(lease, group), rewards))
            except Exception as err:  # noqa: BLE001 - as above
                self._give_up(lease, err)
        valid = [group for _, _, group, _ in prepared if group is not None]
        try:
            results = iter(self.buffer.put_many(valid))
        except Exception as err:  # noqa: BLE001 - none known written: their quota goes back below
            log.error("writing %d groups failed: %s", len(valid), err)
            results = iter([err] * len(valid))
        completions = [self._skip(*b, reason=reason) for b, reason in skipped]
        for lease, gens, group, rewards in prepared:
            outcome = next(results) if group is not None else None
            try:
                completions.append(self._record(lease, gens, group, rewards, outcome))
            except Exception as err:  # noqa: BLE001 - logged; the lease is given up (it expires)
                log.warning("lease %s: %s: %s", lease.lease_id, type(err).__name__, err)
        try:
            self._complete(completions)
        except Exception as err:  # noqa: BLE001 - logged; the leases expire and their quota returns
            log.warning("completing %d leases: %s: %s", len(completions), type(err).__name__, err)
        finally:
            # Completed, or given up: either way no longer held, so if the controller never heard of a
            # completion it expires that lease as abandoned at the next heartbeat (its quota comes back).
            for lease, *_ in prepared + [b for b, _ in skipped]:
                self.session.held.discard(lease.lease_id)
        return sum(1 for c in completions if c.num_written)

    def _score_process(self, built: list, prompts: list, leases: list) -> None:
        """Process rewards of the built groups (their prompts found through their leases); a failure leaves the
        groups without them, logged: the outcome reward still trains."""
        prompt_of = {lease.lease_id: prompt for lease, prompt in zip(leases, prompts)}
        try:
            done = self.process_scorer.score([group for _, _, group, _ in built],
                                             [prompt_of[lease.lease_id] for lease, *_ in built])
        except Exception as err:  # noqa: BLE001 - the groups go on without process rewards
            log.warning("process rewards: %s: %s", type(err).__name__, err)
            return
        self.metrics.process_reward_seconds.observe(done.seconds)
        self.events.write(ProcessRewardsScored(groups=len(built), responses=done.responses, episodes=done.episodes,
                                               seconds=done.seconds, version=done.version))

    def _skip(self, lease, gens, group, rewards, reason: str) -> controller_pb2.LeaseCompletion:
        """A group not written (`reason` "uniform": uniform rewards; "environment_error": an episode that never
        reached the model's first turn): recorded, counted, and its lease's completion with nothing written (the
        quota returns). An environment's failure says nothing of the prompt's difficulty: no reward reported."""
        reward_mean = sum(rewards) / len(rewards)
        self.events.write(GroupSkipped(group_id=group.group_id, lease_id=lease.lease_id,
                                       prompt_index=lease.prompt_index, reward=reward_mean, reason=reason,
                                       trajectories=len(gens)))
        uniform = reason == "uniform"
        (self.metrics.groups_uniform if uniform else self.metrics.groups_unplayable).inc()
        return controller_pb2.LeaseCompletion(lease_id=lease.lease_id, num_written=0,
                                              reward_mean=reward_mean if uniform else None)

    def _give_up(self, lease, err: Exception) -> None:
        log.warning("lease %s: %s: %s", lease.lease_id, type(err).__name__, err)
        self.session.held.discard(lease.lease_id)

    def _build(self, lease, prompt, gens):
        """(the lease's group, its rewards)."""
        rewards = self._rewards(prompt, gens)
        group = build_group(
            group_id=f"{self.session.replica_id}-{lease.lease_id}",
            prompt_index=lease.prompt_index,
            sample_index=lease.sample_index if lease.HasField("sample_index") else None,
            prompt_token_ids=list(prompt.token_ids),
            generations=gens,
            rewards=rewards,
            replica_id=self.session.replica_id,
            lease_id=lease.lease_id,
            metadata=prompt.metadata,
        )
        return group, rewards

    def _rewards(self, prompt, gens) -> list[float]:
        """The task's reward of each response, on the reward pool."""
        return self.rewards.score([(self.task.decode_response(g.token_ids), prompt.metadata) for g in gens])

    def _checked(self, lease, group):
        """`group` if it passes the checks; None when it failed them and went to the dead letters."""
        try:
            check_trajectory_group(group, self.limits.with_max_version(self.engine.weight_version))
        except BadGroup as err:
            # Never into the training stream; kept with its reason, and the lease's quota goes back.
            log.error("group %s refused: %s", group.group_id, err)
            self.events.write(GroupRejected(group_id=group.group_id, lease_id=lease.lease_id, reason=str(err)))
            self.metrics.groups_rejected.inc()
            self.buffer.put_dead_letter(group.SerializeToString(), str(err))
            return None
        return group

    def _record(self, lease, gens, group, rewards, outcome) -> controller_pb2.LeaseCompletion:
        """Record the write (`outcome`: the entry id, or the error that kept the group out); the lease's
        completion with what was written."""
        entry_id = outcome if isinstance(outcome, str) else None
        if isinstance(outcome, BaseException):
            log.error("writing group %s failed: %s", group.group_id, outcome)
        # The record comes right after the write and before the lease completes, so a replica killed in
        # between leaves either a record or an expiring lease for the audit, never a completed lease alone.
        if entry_id is not None:
            versions = [v for g in gens for v in g.weight_version]
            self.events.write(GroupWritten(
                group_id=group.group_id, entry_id=entry_id, lease_id=lease.lease_id,
                prompt_index=lease.prompt_index, lease_version=lease.version,
                min_version=min(versions) if versions else -1, max_version=max(versions) if versions else -1,
                reward_mean=sum(rewards) / len(rewards), length_mean=sum(g.model_tokens for g in gens) / len(gens),
                turns_mean=sum(g.turns for g in gens) / len(gens), trajectories=len(gens),
            ))
            self.metrics.groups_written.inc()
            self.metrics.reward_mean.set(sum(rewards) / len(rewards))
        # Completing after the write: a lease completed as written is data the learner will find.
        return controller_pb2.LeaseCompletion(lease_id=lease.lease_id,
                                              num_written=len(gens) if entry_id is not None else 0,
                                              reward_mean=sum(rewards) / len(rewards))

    def _complete(self, completions: list) -> None:
        """CompleteLeases, retried with backoff while the controller is unreachable or slow (a transient error
        must not cost the groups); other answers are final. A lease that expired meanwhile is logged."""
        if not completions:
            return
        request = controller_pb2.CompleteLeasesRequest(replica_id=self.session.replica_id, completions=completions)
        for attempt in range(COMPLETE_ATTEMPTS):
            try:
                answer = self.stub.CompleteLeases(request, timeout=30)
                break
            except grpc.RpcError as err:
                retry = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retry or attempt == COMPLETE_ATTEMPTS - 1:
                    raise
                log.warning("CompleteLeases (%d leases): %s; retrying", len(completions), err.code().name)
                time.sleep(COMPLETE_BACKOFF_S * 2**attempt)
        for outcome in answer.outcomes:
            if not outcome.completed:
                log.warning("lease %s not completed: %s", outcome.lease_id, outcome.error)
