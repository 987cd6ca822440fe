import pytest
import torch

from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.buckets import pack, plan_buckets, unpack
from asyncrl.push.plan import PushPlan
from tests.conftest import TEST_STORE_KEY


def metas(*specs):
    return tuple(TensorMeta(name, shape, dtype) for name, shape, dtype in specs)


def test_buckets_split_by_size_and_dtype():
    m = metas(("a", (4,), "float32"), ("b", (2, 2), "float32"), ("c", (8,), "float32"), ("d", (3,), "int64"))
    # 16 bytes per 4-float tensor; bucket of 32 bytes holds a+b, c (32 bytes) alone, d different dtype.
    buckets = plan_buckets(m, 32)
    assert [b.members for b in buckets] == [(0, 1), (2,), (3,)]
    assert [b.numel for b in buckets] == [8, 8, 3]
    assert [b.dtype for b in buckets] == ["float32", "float32", "int64"]


def test_oversized_tensor_gets_its_own_bucket():
    m = metas(("big", (100,), "float32"), ("small", (1,), "float32"))
    assert [b.members for b in plan_buckets(m, 8)] == [(0,), (1,)]


def test_pack_unpack_round_trip():
    tensors = [torch.arange(6.0).view(2, 3), torch.tensor([7.0, 8.0])]
    m = metas(("w", (2, 3), "float32"), ("b", (2,), "float32"))
    (bucket,) = plan_buckets(m, 1 << 20)
    flat = pack(bucket, tensors)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7, 8]
    out = dict(unpack(bucket, flat, m))
    assert torch.equal(out["w"], tensors[0]) and torch.equal(out["b"], tensors[1])


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(metas(("a", (1,), "float32")), 0)
    with pytest.raises(ValueError, match="unknown dtype"):
        _ = TensorMeta("x", (1,), "float99").torch_dtype


def test_plan_proto_round_trip():
    plan = PushPlan(push_id="p1", version=3, store_address="127.0.0.1:1234", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=metas(("a", (2, 3), "bfloat16")), bucket_bytes=1024, timeout_s=5.0)
    assert PushPlan.from_proto(plan.to_proto()) == plan
    assert plan.store_host == "127.0.0.1" and plan.store_port == 1234
    assert plan.total_bytes == 12


def test_a_plan_naming_a_manifest_and_a_kept_group_round_trips_and_is_checked():
    from asyncrl.core.checks.validation import InvalidArgument
    from asyncrl.push.manifest import manifest_bytes

    _, digest = manifest_bytes(metas(("a", (2, 3), "float32")))
    plan = PushPlan(push_id="p2", version=4, store_address="127.0.0.1:1234", store_key=TEST_STORE_KEY, world_size=3, transport="gloo", tensors=(), bucket_bytes=1024, timeout_s=5.0, group_id="group-1", new_group=False,
                    manifest_digest=digest)
    assert PushPlan.from_proto(plan.to_proto()) == plan
    assert plan.group_key == "group/group-1/"
    assert PushPlan(push_id="p3", version=1, store_address="h:1", store_key=TEST_STORE_KEY, world_size=2, transport="gloo", tensors=(), bucket_bytes=1, timeout_s=1.0).group_key == "push/p3/group/"

    def refused(**fields) -> str:
        msg = plan.to_proto()
        for name, value in fields.items():
            if name == "tensors":
                msg.tensors.add(name="a", shape=[2, 3], dtype="float32")
            else:
                setattr(msg, name, value)
        with pytest.raises(InvalidArgument) as err:
            PushPlan.from_proto(msg)
        return err.value.field

    assert refused(manifest_digest="abc") == "plan.manifest_digest"
    assert refused(manifest_digest=digest.upper()) == "plan.manifest_digest"
    assert refused(tensors=True) == "plan.tensors"
    assert refused(group_id="") == "plan.new_group"  # reusing "no group" means nothing
    assert refused(group_id="bad id!") == "plan.group_id"


def test_the_torch_free_dtype_table_is_torchs_own():
    # The controller checks plans without torch; the names it accepts and their sizes must be torch's.
    from asyncrl.core.wire.push_contract import DTYPE_BYTES

    torch_dtypes = {name: value for name in dir(torch) if isinstance(value := getattr(torch, name), torch.dtype)}
    assert set(DTYPE_BYTES) == set(torch_dtypes)
    for name, dtype in torch_dtypes.items():
        meta = TensorMeta("w", (3,), name)
        assert meta.itemsize == dtype.itemsize and meta.torch_dtype is dtype and meta.nbytes == 3 * dtype.itemsize
    with pytest.raises(ValueError, match="unknown dtype 'Tensor'"):
        _ = TensorMeta("w", (3,), "Tensor").nbytes


def test_the_controller_and_the_config_load_without_torch():
    # A restarted controller answers about a second sooner without torch; `asyncrl` tools start at once.
    import subprocess
    import sys

    code = ("import sys, services.controller_service, asyncrl.core.config.schema, asyncrl.push.manifest; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
