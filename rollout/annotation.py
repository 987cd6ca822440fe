"""Teacher annotation on the producer side (`teacher.annotate_by: rollout`): the replica asks the teacher for
the per-token log-probs of each group it wrote, before writing it, on the thread that finishes a batch while
the next one generates. The learner then finds `Trajectory.logp_teacher` filled and never waits on `Score`.

A teacher that stays unreachable does not cost the group: it is written without the annotation and the
learner asks for it itself (its fallback), or trains that step without the distillation term.
"""

from __future__ import annotations

import logging
import time

import grpc

from asyncrl.v1 import teacher_pb2, trajectory_pb2

log = logging.getLogger("asyncrl.rollout")


def score_request(group: trajectory_pb2.TrajectoryGroup) -> teacher_pb2.ScoreRequest:
    """One sequence per trajectory: prompt + response, the response starting after the prompt."""
    return teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=[*t.prompt_token_ids, *t.response_token_ids],
                                  response_start=len(t.prompt_token_ids))
        for t in group.trajectories
    ])


def fill_logp_teacher(group: trajectory_pb2.TrajectoryGroup, reply: teacher_pb2.ScoreResponse) -> None:
    """Each trajectory's logp_teacher from the reply, one value per response token (all or none)."""
    if len(reply.sequences) != len(group.trajectories):
        raise ValueError(f"{len(reply.sequences)} scored sequences for {len(group.trajectories)} trajectories")
    for traj, scored in zip(group.trajectories, reply.sequences):
        if len(scored.logp_teacher) != len(traj.response_token_ids):
            raise ValueError(f"trajectory {traj.trajectory_id!r}: {len(scored.logp_teacher)} teacher log-probs "
                             f"for {len(traj.response_token_ids)} tokens")
    for traj, scored in zip(group.trajectories, reply.sequences):
        del traj.logp_teacher[:]
        traj.logp_teacher.extend(scored.logp_teacher)


class TeacherAnnotator:
    def __init__(self, teacher_stub, teacher_cfg, metrics):
        self.stub = teacher_stub
        self.cfg = teacher_cfg
        self.metrics = metrics

    def annotate(self, group: trajectory_pb2.TrajectoryGroup) -> bool:
        """Fill the group's logp_teacher; False (the group untouched) when the teacher did not answer within
        `teacher.score_attempts` calls or answered something that does not fit the group."""
        request = score_request(group)
        started = time.perf_counter()
        for attempt in range(self.cfg.score_attempts):
            if attempt:
                time.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            try:
                reply = self.stub.Score(request, timeout=self.cfg.score_timeout_s)
                fill_logp_teacher(group, reply)
                self.metrics.teacher_seconds.observe(time.perf_counter() - started)
                return True
            except grpc.RpcError as err:
                log.warning("teacher Score for %s, attempt %d/%d: %s %s", group.group_id, attempt + 1,
                            self.cfg.score_attempts, err.code().name, err.details())
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    break  # the same request would fail again
            except ValueError as err:
                log.warning("teacher Score for %s: %s", group.group_id, err)
                break
        self.metrics.teacher_failures.inc()
        return False
