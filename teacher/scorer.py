"""The teacher's logic: score token sequences with its engine, one log-prob per response position
(`logp_teacher`, for on-policy distillation). Checks every request against the model's vocabulary and the
per-call limit first, naming the offending field; the gRPC edge (`asyncrl.services.teacher_service`) only
translates messages."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram

from asyncrl.core.checks.validation import check_token_ids, require
from asyncrl.core.engines.base import Engine
from asyncrl.core.runtime.metrics import service_registry


class TeacherMetrics:
    def __init__(self):
        self.registry = r = service_registry("teacher")
        self.sequences = Counter("asyncrl_teacher_sequences_scored", "Sequences scored", registry=r)
        self.tokens = Counter("asyncrl_teacher_tokens_scored", "Response tokens scored", registry=r)
        self.seconds = Histogram("asyncrl_teacher_score_seconds", "Score RPC time", registry=r)


class TeacherScorer:
    def __init__(self, engine: Engine, vocab_size: int, context: int, max_sequences: int,
                 metrics: TeacherMetrics | None = None):
        self.engine, self.vocab_size = engine, vocab_size
        self.context = context
        """Tokens per sequence at most (the model's context)."""
        self.max_sequences = max_sequences
        """Sequences per call at most (one learner batch): how long one caller can hold the engine."""
        self.metrics = metrics or TeacherMetrics()

    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        """log pi_teacher of tokens [start:] of each sequence; raises InvalidArgument naming the field."""
        require(len(sequences) > 0, "sequences", "must not be empty")
        require(len(sequences) <= self.max_sequences, "sequences",
                f"at most {self.max_sequences} per call (learner.batch_size), got {len(sequences)}")
        for i, (ids, start) in enumerate(zip(sequences, response_starts)):
            require(len(ids) <= self.context, f"sequences[{i}].token_ids",
                    f"at most {self.context} tokens (the model's context), got {len(ids)}")
            check_token_ids(ids, self.vocab_size, f"sequences[{i}].token_ids")
            require(1 <= start <= len(ids), f"sequences[{i}].response_start",
                    f"must be in [1, {len(ids)}], got {start}")  # fmt: skip
        began = time.perf_counter()
        scores = self.engine.score(sequences, response_starts)
        self.metrics.seconds.observe(time.perf_counter() - began)
        self.metrics.sequences.inc(len(scores))
        self.metrics.tokens.inc(sum(len(s) for s in scores))
        return scores

    def close(self) -> None:
        self.engine.close()

