"""Sparse delta pushes across real processes: the sender (rank 0, hosting the store) and three receivers in one
kept gloo group, each reading pushes the way an engine does (`push.receiving`)."""

import multiprocessing as mp

import pytest
import torch

from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.push import deltas
from asyncrl.push.broadcast import host_store
from asyncrl.push.deltas import Base
from asyncrl.push.flat import FlatWeights
from asyncrl.push.groups import BroadcastGroups
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import send_delta

pytestmark = pytest.mark.integration


def versions():
    """Version 1, then 2 and 3 each with a few elements changed (a bfloat16 copy at a small learning rate)."""
    g = torch.Generator().manual_seed(0)
    v1 = [("layer.weight", torch.randn(64, 32, generator=g).to(torch.bfloat16)),
          ("emb", torch.randn(100, 16, generator=g).to(torch.bfloat16)), ("steps", torch.arange(5))]
    v2 = [(name, t.clone()) for name, t in v1]
    v2[0][1][3, :4] += 1
    v2[1][1][50, 0] = -v2[1][1][50, 0]
    v3 = [(name, t.clone()) for name, t in v2]
    v3[0][1][60, 31] += 1
    return [v1, v2, v3]


def bits(named):
    return {name: t.view(torch.int16 if t.dtype == torch.bfloat16 else t.dtype).numpy().copy() for name, t in named}


def receiver(plans, rank, mode, queue):
    from asyncrl.push.deltas import BaseMissing
    from asyncrl.push.receiving import BroadcastReceiving

    receiving = BroadcastReceiving()
    for plan in plans:
        try:
            with receiving.open(plan, rank) as stream:
                if mode == "whole" or (mode == "misses-2" and plan.version != 2):
                    got = stream.whole() if mode == "whole" else {n: t.clone() for b in stream.buckets() for n, t in b}
                    if mode == "whole":
                        stream.adopted()
                    queue.put((plan.version, rank, bits(got.items())))
                elif mode == "misses-2":
                    stream.drain()  # as a receiver that refused version 2: it still holds 1
                    queue.put((plan.version, rank, "drained"))
                else:
                    queue.put((plan.version, rank, bits((n, t.clone()) for b in stream.buckets() for n, t in b)))
        except BaseMissing as err:
            queue.put((plan.version, rank, f"BaseMissing: {err}"))


@pytest.mark.parametrize("transport", ["gloo", "gloo-relay"])
def test_a_delta_push_brings_every_receiver_that_holds_its_base_the_senders_bytes(transport):
    """Version 1 travels whole (no base yet), 2 and 3 as their changes. Rank 1 reads bucket by bucket (vLLM's
    way: a kept copy), rank 2 whole into spare storage (the torch engine's), rank 3 drops version 2 and so
    fails version 3 alone, while the others get it."""
    store = host_store("127.0.0.1", 0, 30)
    named = versions()
    metas = tensor_metas(named[0])
    plans = [PushPlan(push_id=f"push-{v}", version=v, store_address=f"127.0.0.1:{store.port}",
                      store_key=store.key, world_size=4, transport=transport, tensors=metas, bucket_bytes=1024,
                      timeout_s=30, group_id="g", new_group=v == 1, sparse_deltas=True) for v in (1, 2, 3)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(plans, rank, mode, queue))
             for rank, mode in ((1, "buckets"), (2, "whole"), (3, "misses-2"))]
    for p in procs:
        p.start()
    groups, base, sent = BroadcastGroups(store), None, []
    for plan, version in zip(plans, named):
        weights = FlatWeights(metas, plan.bucket_bytes)
        for name, tensor in version:
            weights.views[name].copy_(tensor)
        with groups.member(plan, 0) as group:
            sent.append(send_delta(group, weights, plan, base))
        base = Base(weights, plan.version)
    results = {(v, rank): got for v, rank, got in (queue.get(timeout=90) for _ in range(9))}
    for p in procs:
        p.join(timeout=30)
    groups.close()

    header = (len(weights.buffers) + 1) * 8
    assert sent[0] == header + plans[0].total_bytes
    # Version 2 changed 5 bfloat16 elements in two buckets: (16 + 8) + (8 + 2) bytes of pairs.
    assert sent[1] == header + 24 + 10
    assert sent[2] == header + 8 + 2
    for v, expected in zip((1, 2, 3), named):
        for rank in (1, 2):
            assert results[(v, rank)].keys() == bits(expected).keys()
            for name, value in bits(expected).items():
                assert (results[(v, rank)][name] == value).all(), (v, rank, name)
    assert results[(1, 3)].keys() == bits(named[0]).keys()
    assert results[(2, 3)] == "drained"
    assert results[(3, 3)] == "BaseMissing: push push-3 (version 3) changes version 2; this receiver holds version 1"


def test_a_push_without_a_base_travels_whole_with_a_header_naming_none():
    store = host_store("127.0.0.1", 0, 10)
    named = versions()[0]
    plan = PushPlan(push_id="p", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key,
                    world_size=1, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1024, timeout_s=10,
                    sparse_deltas=True)
    weights = FlatWeights(plan.tensors, plan.bucket_bytes)
    with BroadcastGroups(store).member(plan, 0) as group:
        other_layout = Base(FlatWeights(plan.tensors, 2048), 0)
        assert send_delta(group, weights, plan, other_layout) == (len(weights.buffers) + 1) * 8 + plan.total_bytes
    assert deltas.NO_BASE == -1


def engine_matches(engine, model) -> bool:
    theirs = dict(engine.model.named_parameters())
    return all(torch.equal(theirs[name], p) for name, p in model.named_parameters())


def test_a_learners_pushes_travel_as_deltas_while_the_group_holds_and_whole_after_a_receiver_failed(
        tiny_model_dir, tmp_path, caplog):
    """Through the controller and two torch engines: version 1 forms the group and travels whole, version 2
    (three elements changed) as its changes. A replica whose weights were altered meanwhile applies version 3's
    changes to the wrong base: its checksum differs, the push fails there alone, and version 4 goes whole to a
    new group that both replicas take exactly."""
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.push.sender import WeightPublisher
    from tests.integration.test_background_push import push_system

    with push_system(tiny_model_dir, tmp_path, in_band=True, sparse_deltas=True) as (config, stub, engines, _, _):
        learner = load_causal_lm(tiny_model_dir.policy)
        first = next(learner.parameters())
        publisher = WeightPublisher(stub, learner, config.learner.weight_transport, config.controller.push_timeout_s)
        # float32 weights: a few elements are changed by hand here, but a trained float32 copy changes almost
        # everywhere, and the learner says so.
        assert "weights travel in 32-bit floats" in caplog.text
        try:
            one = publisher.push(1)
            header = (len(publisher.flat.buffers) + 1) * 8
            assert one.new_group and one.bytes_sent == header + sum(m.nbytes for m in publisher.metas)
            with torch.no_grad():
                first.view(-1)[:3] += 1
            two = publisher.push(2)
            # Three float32 changes in one bucket: 16 bytes of indices (12 padded), 12 of values.
            assert two.in_band and not two.new_group and two.bytes_sent == header + 16 + 12
            assert all(engine_matches(e, learner) and e.weight_version == 2 for e in engines)

            with torch.no_grad():
                next(engines[0].model.parameters()).view(-1)[7] += 1  # its base is no longer version 2
                first.view(-1)[5] += 1
            three = publisher.push(3)
            assert three.committed and len(three.dropped) == 1 and three.bytes_sent == header + 8 + 4
            assert engines[1].weight_version == 3 and engine_matches(engines[1], learner)

            four = publisher.push(4)
            assert four.new_group and four.bytes_sent == header + sum(m.nbytes for m in publisher.metas)
            assert all(engine_matches(e, learner) and e.weight_version == 4 for e in engines)
        finally:
            publisher.close()
