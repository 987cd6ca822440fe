"""The gloo data plane across real processes: one sender (rank 0, hosting the store), two receivers."""

import multiprocessing as mp

import pytest
import torch

from asyncrl.core.weights.plan import PushPlan, tensor_metas
from asyncrl.core.weights.transport import host_store, make_group, receive_weights, send_weights

pytestmark = pytest.mark.integration


def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return [("layer.weight", torch.randn(64, 32, generator=g)), ("layer.bias", torch.randn(64, generator=g)),
            ("emb", torch.randn(100, 16, generator=g)), ("steps", torch.arange(5))]


def receiver(plans, rank, queue):
    for plan in plans:
        got = {}
        group = make_group(plan, rank)
        for bucket in receive_weights(group, plan):
            got.update({name: t.numpy().copy() for name, t in bucket})  # by value, not shared fds
        queue.put((plan.push_id, rank, got))


def test_two_receivers_get_identical_tensors_over_successive_pushes():
    """Two pushes on one store (groups are per push), many small buckets then one big one."""
    store = host_store("127.0.0.1", 0, 30)
    named = weights(0)
    plans = [PushPlan(push_id, 1, f"127.0.0.1:{store.port}", 3, "gloo", tensor_metas(named), bucket_bytes, 30)
             for push_id, bucket_bytes in (("push-a", 256), ("push-b", 1 << 20))]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(plans, r, queue)) for r in (1, 2)]
    for p in procs:
        p.start()
    for plan in plans:
        assert send_weights(make_group(plan, 0, store), named, plan) == plan.total_bytes
    results = {(push_id, rank): got for push_id, rank, got in (queue.get(timeout=90) for _ in range(4))}
    for p in procs:
        p.join(timeout=30)
    for (push_id, rank), got in results.items():
        for name, tensor in named:
            assert torch.equal(torch.from_numpy(got[name]), tensor), (push_id, rank, name)
    assert len(results) == 4


def test_sender_refuses_a_tensor_count_mismatch():
    store = host_store("127.0.0.1", 0, 5)
    named = weights(0)
    plan = PushPlan("p", 1, f"127.0.0.1:{store.port}", 1, "gloo", tensor_metas(named), 1024, 5)
    with pytest.raises(ValueError, match="plan lists 4 tensors, got 3"):
        send_weights(make_group(plan, 0, store), named[:3], plan)


def test_a_receiver_that_never_joins_calls_the_push_off_quickly():
    """World of 3, rank 2 never comes: the sender gives up after the join time-out naming rank 2, and rank 1,
    already waiting, is told to abort at once instead of waiting for the push's own time-out (60 s)."""
    import threading
    import time

    from asyncrl.core.weights.rendezvous import PushAborted, ReceiversMissing

    store = host_store("127.0.0.1", 0, 60)
    named = weights(0)
    plan = PushPlan("push-missing", 1, f"127.0.0.1:{store.port}", 3, "gloo", tensor_metas(named), 1024, 60)
    seen = {}

    def rank1():
        t0 = time.monotonic()
        try:
            make_group(plan, 1)
        except PushAborted as err:
            seen["rank1"] = (str(err), time.monotonic() - t0)

    thread = threading.Thread(target=rank1)
    thread.start()
    t0 = time.monotonic()
    with pytest.raises(ReceiversMissing, match=r"rank \[2\]") as info:
        make_group(plan, 0, store, join_timeout_s=1.0)
    assert info.value.ranks == [2] and 1.0 <= time.monotonic() - t0 < 5
    thread.join(10)
    message, waited = seen["rank1"]
    assert "called off" in message and waited < 5



def test_a_receiver_that_joins_then_vanishes_costs_the_formation_timeout():
    """Rank 1 passes the join handshake, then never forms the group (its process died in between): the
    sender gives up after the plan's join time-out (1 s), not after the push's data time-out (60 s)."""
    import threading
    import time

    from asyncrl.core.weights.rendezvous import receiver_join
    from asyncrl.core.weights.transport import connect_store, push_store

    store = host_store("127.0.0.1", 0, 60)
    named = weights(0)
    plan = PushPlan("push-vanish", 1, f"127.0.0.1:{store.port}", 2, "gloo", tensor_metas(named), 1024, 60,
                    join_timeout_s=1.0)  # fmt: skip
    joined = threading.Thread(target=receiver_join, args=(push_store(connect_store(plan), plan), plan.push_id, 1, 10))
    joined.start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        make_group(plan, 0, store)
    waited = time.monotonic() - t0
    joined.join(10)
    assert 1.0 <= waited < 5, waited
