"""Calling the teacher's `Score`, as the replicas and the learner both do: one request, retried with
exponential backoff while the teacher is unreachable or slow, never retried when the request itself was
refused (INVALID_ARGUMENT: the same bytes would fail again)."""

from __future__ import annotations

import logging
import time

import grpc

from asyncrl.v1 import teacher_pb2

log = logging.getLogger("asyncrl.teacher_client")


def score_request(sequences: list[list[int]], response_starts: list[int]) -> teacher_pb2.ScoreRequest:
    return teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=seq, response_start=start)
        for seq, start in zip(sequences, response_starts)
    ])


def score(stub, request: teacher_pb2.ScoreRequest, teacher_cfg) -> tuple[teacher_pb2.ScoreResponse | None, str]:
    """(the reply, "") or (None, why) after `teacher.score_attempts` calls, `retry_backoff_s` doubling between
    them; a reply with another number of sequences than asked for counts as no reply."""
    error = ""
    for attempt in range(teacher_cfg.score_attempts):
        if attempt:
            time.sleep(teacher_cfg.retry_backoff_s * 2 ** (attempt - 1))
        try:
            reply = stub.Score(request, timeout=teacher_cfg.score_timeout_s)
        except grpc.RpcError as err:
            error = f"{err.code().name}: {err.details()}"
            log.warning("teacher Score attempt %d/%d failed: %s", attempt + 1, teacher_cfg.score_attempts, error)
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                break  # the same request would fail again
            continue
        if len(reply.sequences) != len(request.sequences):
            return None, f"{len(reply.sequences)} scored sequences for {len(request.sequences)}"
        return reply, ""
    return None, error
