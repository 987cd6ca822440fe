"""Bucket-shaped weight storage: layout, rebinding without copies, adjacent-run detection."""

import pytest
import torch

from asyncrl.core.model.modeling import rebind_parameters, weight_slots
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.push.buckets import pack, plan_buckets
from asyncrl.push.flat import FlatWeights, adjacent_run, bind_parameters


def model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    return m


def test_views_follow_the_bucket_layout():
    named = list(model().state_dict().items())
    flat = FlatWeights(tensor_metas(named), bucket_bytes=64)
    buckets = plan_buckets(tensor_metas(named), 64)
    assert [b.numel for b in buckets] == [buf.numel() for buf in flat.buffers]
    for name, tensor in named:
        flat.views[name].copy_(tensor)
    # Each buffer equals what pack() would have produced for its bucket.
    tensors = [t for _, t in named]
    for bucket, buffer in zip(buckets, flat.buffers):
        assert torch.equal(buffer, pack(bucket, tensors))
    assert flat.matches(tensor_metas(named), 64) and not flat.matches(tensor_metas(named), 128)


def test_bind_moves_parameters_without_changing_values_or_objects():
    m = model()
    before = {n: t.clone() for n, t in m.state_dict().items()}
    params = [id(p) for p in m.parameters()]
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    flat = bind_parameters(m, [(n, p.detach()) for n, p in m.named_parameters()], bucket_bytes=1 << 20)
    assert [id(p) for p in m.parameters()] == params
    assert all(torch.equal(m.state_dict()[n], t) for n, t in before.items())
    # Training updates the flat storage in place: the sender sees new values without any packing.
    m(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert torch.equal(flat.views["0.weight"], m[0].weight.detach())
    assert not torch.equal(flat.views["0.weight"], before["0.weight"])
    run = adjacent_run([m[0].weight.detach(), m[0].bias.detach(), m[1].weight.detach()])
    assert run is not None and run.data_ptr() == flat.buffers[0].data_ptr() and run.numel() == 12 + 3 + 3


def test_adjacent_run_refuses_gaps_order_and_separate_tensors():
    buffer = torch.arange(10.0)
    a, b, c = buffer[0:4], buffer[4:6], buffer[7:10]
    assert torch.equal(adjacent_run([a, b]), buffer[:6])
    assert adjacent_run([a, c]) is None  # gap
    assert adjacent_run([b, a]) is None  # wrong order
    assert adjacent_run([torch.zeros(2), torch.zeros(2)]) is None  # separate storages
    assert adjacent_run([buffer[0:8:2]]) is None  # not contiguous


def test_rebind_refuses_a_mismatched_layout():
    m = model()
    named = [(n, p.detach().double()) for n, p in m.named_parameters()]
    flat = FlatWeights(tensor_metas(named), 1 << 20)
    with pytest.raises(ValueError, match="cannot rebind '0.weight'.*float32.*float64"):
        rebind_parameters(m, flat.views)


def test_weight_slots_name_every_weight_and_a_rebind_with_them_equals_one_without():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    m[1].weight = m[0].weight  # tied: one Parameter under two names
    m.register_buffer("scale", torch.ones(3))
    slots = weight_slots(m)
    assert slots["0.weight"] is slots["1.weight"] is m[0].weight and slots["scale"] is m.scale
    assert set(m.state_dict()) <= set(slots)
    # What a push carries: tied weights once (`modeling.named_weights`), buffers too.
    named = [(n, p.detach() + 1) for n, p in m.named_parameters()] + [("scale", m.scale + 1)]
    flat = FlatWeights(tensor_metas(named), 1 << 20)
    for name, tensor in named:
        flat.views[name].copy_(tensor)
    rebind_parameters(m, flat.views, slots)
    assert all(torch.equal(m.state_dict()[n], t) for n, t in named)
    assert m[1].weight.data_ptr() == m[0].weight.data_ptr() == flat.views["0.weight"].data_ptr()
    with pytest.raises(ValueError, match="no weight of that name"):
        rebind_parameters(m, flat.views, {})
