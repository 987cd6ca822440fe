"""Request validation shared by the service edges: each check names the offending field. (Weight-push
manifests are checked by `asyncrl.core.weights.manifest`.)"""

from __future__ import annotations

from asyncrl.core.grpc_util import require


def check_token_ids(ids, vocab_size: int, field: str) -> None:
    require(len(ids) > 0, field, "must not be empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    require(not bad, field, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
