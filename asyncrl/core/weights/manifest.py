"""The tensor manifest of a weight push: the one codec (proto <-> `TensorMeta`, `PushPlan`) and the one
validator, used wherever a manifest enters a process (the controller's BeginWeightPush, a replica's
UpdateWeights) and wherever one is held against a model (the torch engine's parameters, vLLM's checkpoint).

Two kinds of check, each written once:
- structural (`decode_tensors`, `decode_plan`): names present and unique, dims >= 0, dtypes that torch
  knows, a transport that exists; failures are `InvalidArgument` naming the request field;
- against a model (`match_model`): every tensor of the model exactly once, with its shape, floating dtypes;
  failures are `ValueError` naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from asyncrl.core.validation import InvalidArgument, require
from asyncrl.core.weights.plan import PushPlan, TensorMeta
from asyncrl.v1 import weights_pb2

Transport = Literal["gloo", "nccl"]
"""Data planes of the weight push: gloo (CPU tensors) or nccl (GPU tensors)."""
TRANSPORTS: tuple[str, ...] = get_args(Transport)


def encode_tensors(metas: Iterable[TensorMeta]) -> list[weights_pb2.TensorSpec]:
    return [weights_pb2.TensorSpec(name=m.name, shape=list(m.shape), dtype=m.dtype) for m in metas]


def decode_tensors(specs, field: str = "tensors") -> tuple[TensorMeta, ...]:
    """`TensorSpec`s -> `TensorMeta`s, refusing an empty list, empty or repeated names, negative dims and
    dtypes torch does not know."""
    require(len(specs) >= 1, field, "must list at least one tensor")
    seen: set[str] = set()
    metas = []
    for i, spec in enumerate(specs):
        where = f"{field}[{i}]"
        require(bool(spec.name), f"{where}.name", "must not be empty")
        require(spec.name not in seen, f"{where}.name", f"duplicate tensor name {spec.name!r}")
        seen.add(spec.name)
        require(all(d >= 0 for d in spec.shape), f"{where}.shape", f"dims must be >= 0, got {list(spec.shape)}")
        meta = TensorMeta(spec.name, tuple(spec.shape), spec.dtype)
        try:
            _ = meta.torch_dtype  # raises for a name that is not a torch dtype
        except ValueError:
            raise InvalidArgument(f"{where}.dtype", f"unknown torch dtype {spec.dtype!r}") from None
        metas.append(meta)
    return tuple(metas)


def check_address(value: str, field: str) -> None:
    host, sep, port = value.rpartition(":")
    ok = bool(sep) and bool(host) and port.isdigit() and 1 <= int(port) <= 65535
    require(ok, field, f"must be host:port, got {value!r}")


def check_transport(value: str, field: str) -> None:
    require(value in TRANSPORTS, field, f"must be one of {TRANSPORTS}, got {value!r}")


def check_optional_seconds(value: float, field: str) -> None:
    """A time-out where 0 means "the default"."""
    require(math.isfinite(value) and value >= 0, field, f"must be >= 0 (0 = the default), got {value}")


def encode_plan(plan: PushPlan) -> weights_pb2.WeightPushPlan:
    return weights_pb2.WeightPushPlan(
        push_id=plan.push_id,
        version=plan.version,
        store_address=plan.store_address,
        world_size=plan.world_size,
        transport=plan.transport,
        tensors=encode_tensors(plan.tensors),
        bucket_bytes=plan.bucket_bytes,
        timeout_s=plan.timeout_s,
        join_timeout_s=plan.join_timeout_s,
    )


def decode_plan(msg, field: str = "plan") -> PushPlan:
    """A `WeightPushPlan` message -> `PushPlan`, every field checked."""
    require(bool(msg.push_id), f"{field}.push_id", "must not be empty")
    require(msg.version >= 0, f"{field}.version", f"must be >= 0, got {msg.version}")
    check_address(msg.store_address, f"{field}.store_address")
    require(msg.world_size >= 2, f"{field}.world_size", f"must be >= 2 (learner + receivers), got {msg.world_size}")
    check_transport(msg.transport, f"{field}.transport")
    require(msg.bucket_bytes > 0, f"{field}.bucket_bytes", f"must be > 0, got {msg.bucket_bytes}")
    require(math.isfinite(msg.timeout_s) and msg.timeout_s > 0, f"{field}.timeout_s", f"must be > 0, got {msg.timeout_s}")
    check_optional_seconds(msg.join_timeout_s, f"{field}.join_timeout_s")
    return PushPlan(
        push_id=msg.push_id,
        version=msg.version,
        store_address=msg.store_address,
        world_size=msg.world_size,
        transport=msg.transport,
        tensors=decode_tensors(msg.tensors, f"{field}.tensors"),
        bucket_bytes=msg.bucket_bytes,
        timeout_s=msg.timeout_s,
        join_timeout_s=msg.join_timeout_s,
    )


def match_model(
    metas: Iterable[TensorMeta],
    expected: Mapping[str, tuple[int, ...]],
    required: Iterable[str] | None = None,
    *,
    non_float: Iterable[str] = (),
    where: str = "weight push",
) -> None:
    """Hold a manifest against a model's tensors (`expected`: name -> shape): every name known, listed once,
    with the model's shape, and every name of `required` (default: all of `expected`) present. Dtypes: a
    floating dtype, or an integer one for the tensors named in `non_float` (a different dtype of the same
    kind is allowed: the load casts). Raises ValueError naming the tensor."""
    non_float = set(non_float)
    metas = list(metas)
    seen: set[str] = set()
    for meta in metas:
        if meta.name not in expected:
            raise ValueError(f"{where}: tensor {meta.name!r} is not a tensor of the model")
        if meta.name in seen:
            raise ValueError(f"{where}: tensor {meta.name!r} is listed twice")
        seen.add(meta.name)
        if tuple(meta.shape) != tuple(expected[meta.name]):
            raise ValueError(
                f"{where}: tensor {meta.name!r} has shape {tuple(meta.shape)}, the model's is "
                f"{tuple(expected[meta.name])}"
            )
        if meta.torch_dtype.is_floating_point == (meta.name in non_float):
            kind = "an integer" if meta.name in non_float else "a floating"
            raise ValueError(f"{where}: tensor {meta.name!r} has dtype {meta.dtype}, the model's is {kind} dtype")
    missing = sorted(set(expected if required is None else required) - seen)
    if missing:
        raise ValueError(f"{where}: lacks {len(missing)} of the model's tensors, e.g. {missing[0]!r}")
