"""Request validation shared by the service edges: each check names the offending field."""

from __future__ import annotations

from asyncrl.core.grpc_util import require


def check_address(value: str, field: str) -> None:
    host, sep, port = value.rpartition(":")
    require(bool(sep) and bool(host) and port.isdigit() and 0 < int(port) < 65536, field,
            f"must be host:port, got {value!r}")


def check_token_ids(ids, vocab_size: int, field: str) -> None:
    require(len(ids) > 0, field, "must not be empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    require(not bad, field, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")


def check_plan(plan, rank: int) -> None:
    require(bool(plan.push_id), "plan.push_id", "must not be empty")
    require(plan.version >= 0, "plan.version", f"must be >= 0, got {plan.version}")
    check_address(plan.store_address, "plan.store_address")
    require(plan.world_size >= 2, "plan.world_size", f"must be >= 2 (learner + receivers), got {plan.world_size}")
    require(1 <= rank < plan.world_size, "rank", f"must be in [1, {plan.world_size}), got {rank}")
    require(plan.transport in ("gloo", "nccl"), "plan.transport", f"must be 'gloo' or 'nccl', got {plan.transport!r}")
    require(len(plan.tensors) > 0, "plan.tensors", "must list the tensors to receive")
    require(plan.bucket_bytes > 0, "plan.bucket_bytes", f"must be > 0, got {plan.bucket_bytes}")
    require(plan.timeout_s > 0, "plan.timeout_s", f"must be > 0, got {plan.timeout_s}")
    for i, t in enumerate(plan.tensors):
        require(bool(t.name), f"plan.tensors[{i}].name", "must not be empty")
        require(all(d >= 0 for d in t.shape), f"plan.tensors[{i}].shape", f"negative dimension in {list(t.shape)}")
