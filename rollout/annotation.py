"""Teacher annotation on the producer side (`teacher.annotate_by: rollout`): the replica asks the teacher for
the per-token log-probs of the groups of a generation batch, one `Score` call for all of them, before writing
them, on the thread that finishes a batch while the next one generates. The learner then finds
`Trajectory.logp_teacher` filled and never waits on `Score`.

A teacher that stays unreachable does not cost the groups: they are written without the annotation and the
learner asks for it itself (its fallback), or trains that step without the distillation term.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from asyncrl.core.wire.teacher_client import score, score_request
from asyncrl.v1 import teacher_pb2, trajectory_pb2

log = logging.getLogger("asyncrl.rollout")


def request_for(groups: list[trajectory_pb2.TrajectoryGroup]) -> teacher_pb2.ScoreRequest:
    """One sequence per trajectory, group after group: prompt + response, the response after the prompt."""
    trajectories = [t for g in groups for t in g.trajectories]
    return score_request([[*t.prompt_token_ids, *t.response_token_ids] for t in trajectories],
                         [len(t.prompt_token_ids) for t in trajectories])


def fill_logp_teacher(groups: list[trajectory_pb2.TrajectoryGroup], reply: teacher_pb2.ScoreResponse) -> None:
    """Each trajectory's logp_teacher from the reply (in `request_for` order), one value per response token;
    all or none."""
    trajectories = [t for g in groups for t in g.trajectories]
    if len(reply.sequences) != len(trajectories):
        raise ValueError(f"{len(reply.sequences)} scored sequences for {len(trajectories)} trajectories")
    for traj, scored in zip(trajectories, reply.sequences):
        if len(scored.logp_teacher) != len(traj.response_token_ids):
            raise ValueError(f"trajectory {traj.trajectory_id!r}: {len(scored.logp_teacher)} teacher log-probs "
                             f"for {len(traj.response_token_ids)} tokens")
    for traj, scored in zip(trajectories, reply.sequences):
        del traj.logp_teacher[:]
        traj.logp_teacher.extend(scored.logp_teacher)


class TeacherAnnotator:
    def __init__(self, teacher_stub, teacher_cfg, metrics, teacher_channel: grpc.Channel | None = None):
        self.stub = teacher_stub
        self.cfg = teacher_cfg
        self.metrics = metrics
        self.channel = teacher_channel
        """The stub's channel, for `wait_ready` (None: nothing to wait for)."""

    def wait_ready(self, stop: threading.Event, poll_s: float = 0.2) -> bool:
        """Wait until the teacher answers connections, at most `teacher.score_timeout_s` (or until `stop`), before
        the replica takes its first leases: a batch finished while the teacher is still starting waits in its
        `Score` call (and a reconnection backoff), so its groups would reach the learner versions after their
        leases (measured: 1 s and 15 versions at η = 2 when the replicas started with the demo's teacher).
        False when it did not: the groups are then written without annotation (the learner asks itself)."""
        if self.channel is None:
            return True
        ready = grpc.channel_ready_future(self.channel)
        deadline = time.monotonic() + self.cfg.score_timeout_s
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    ready.result(timeout=poll_s)
                    return True
                except grpc.FutureTimeoutError:
                    continue
            if not stop.is_set():
                log.warning("the teacher at %s did not answer within teacher.score_timeout_s (%g s): taking "
                            "leases without it", self.cfg.address, self.cfg.score_timeout_s)
            return False
        finally:
            ready.cancel()

    def annotate(self, groups: list[trajectory_pb2.TrajectoryGroup]) -> bool:
        """Fill the groups' logp_teacher with one `Score` call; False (the groups untouched, counted per group)
        when the teacher did not answer within `teacher.score_attempts` calls or answered something that does
        not fit them."""
        if not groups:
            return True
        started = time.perf_counter()
        reply, error = score(self.stub, request_for(groups), self.cfg)
        if reply is not None:
            try:
                fill_logp_teacher(groups, reply)
                self.metrics.teacher_seconds.observe(time.perf_counter() - started)
                return True
            except ValueError as err:
                error = str(err)
        log.warning("teacher annotation of %d groups failed: %s", len(groups), error)
        self.metrics.teacher_failures.inc(len(groups))
        return False
