"""Request validation shared by every floor: each check raises `InvalidArgument` naming the offending field,
which the service edges answer with INVALID_ARGUMENT (`asyncrl.core.grpc_util.abort_invalid`)."""

from __future__ import annotations


class InvalidArgument(ValueError):
    """Raised by request validation; services turn it into INVALID_ARGUMENT naming the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


def require(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise InvalidArgument(field, problem)


def check_token_ids(ids, vocab_size: int, field: str) -> None:
    require(len(ids) > 0, field, "must not be empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    require(not bad, field, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
