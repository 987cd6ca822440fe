"""The gloo data plane across real processes: one sender (rank 0, hosting the store), two receivers."""

import multiprocessing as mp

import pytest
import torch

from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import receive_weights, send_weights

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


@pytest.mark.parametrize(("transport", "receivers"), [("gloo", 2), ("gloo-relay", 3)])
def test_every_receiver_gets_identical_tensors_over_successive_pushes(transport, receivers):
    """Two pushes on one store (groups are per push), many small buckets then one big one; relayed, the middle
    ranks pass on what they receive (rank 1 to 2, 2 to 3)."""
    store = host_store("127.0.0.1", 0, 30)
    named = weights(0)
    plans = [PushPlan(push_id=push_id, version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key,
                      world_size=receivers + 1, transport=transport, tensors=tensor_metas(named),
                      bucket_bytes=bucket_bytes, timeout_s=30)
             for push_id, bucket_bytes in (("push-a", 256), ("push-b", 1 << 20))]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=receiver, args=(plans, r, queue)) for r in range(1, receivers + 1)]
    for p in procs:
        p.start()
    for plan in plans:
        assert send_weights(make_group(plan, 0, store), named, plan) == plan.total_bytes
    results = {(push_id, rank): got for push_id, rank, got in (queue.get(timeout=90)
                                                                for _ in range(2 * receivers))}
    for p in procs:
        p.join(timeout=30)
    for (push_id, rank), got in results.items():
        for name, tensor in named:
            assert torch.equal(torch.from_numpy(got[name]), tensor), (push_id, rank, name)
    assert len(results) == 2 * receivers


def test_sender_refuses_a_tensor_count_mismatch():
    store = host_store("127.0.0.1", 0, 5)
    named = weights(0)
    plan = PushPlan(push_id="p", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=1, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1024, timeout_s=5)
    with pytest.raises(ValueError, match="plan lists 4 tensors, got 3"):
        send_weights(make_group(plan, 0, store), named[:3], plan)


def test_a_receiver_that_never_joins_calls_the_push_off_quickly():
    """World of 3, rank 2 never comes: the sender gives up after the join time-out naming rank 2, and rank 1,
    already waiting, is told to abort at once instead of waiting for the push's own time-out (60 s)."""
    import threading
    import time

    from asyncrl.push.rendezvous import PushAborted, ReceiversMissing

    store = host_store("127.0.0.1", 0, 60)
    named = weights(0)
    plan = PushPlan(push_id="push-missing", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=3, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1024, timeout_s=60)
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
    assert info.value.ranks == [2] and info.value.absent and 1.0 <= time.monotonic() - t0 < 5
    thread.join(10)
    message, waited = seen["rank1"]
    assert "called off" in message and waited < 5



def test_a_receiver_that_joins_then_vanishes_costs_the_formation_timeout():
    """Rank 1 passes the join handshake, then never forms the group (its process died in between): the
    sender gives up after the plan's join time-out (1 s), not after the push's data time-out (60 s)."""
    import threading
    import time

    from asyncrl.push.broadcast import connect_store, push_store
    from asyncrl.push.rendezvous import receiver_join

    store = host_store("127.0.0.1", 0, 60)
    named = weights(0)
    plan = PushPlan(push_id="push-vanish", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1024, timeout_s=60,
                    join_timeout_s=1.0)  # fmt: skip
    joined = threading.Thread(target=receiver_join, args=(push_store(connect_store(plan), plan), plan.push_id, 1, 10))
    joined.start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        make_group(plan, 0, store)
    waited = time.monotonic() - t0
    joined.join(10)
    assert 1.0 <= waited < 5, waited


def kept_group_receiver(rank, plans, results):
    """A replica's side with a kept group: resolve each plan's manifest, join, receive; report what came."""
    from asyncrl.push.groups import BroadcastGroups, ManifestCache
    from asyncrl.push.rendezvous import PushAborted

    groups, manifests = BroadcastGroups(), ManifestCache()
    while (plan := plans.get(timeout=60)) is not None:
        plan = manifests.resolve(plan, rank)
        try:
            got = {}
            with groups.member(plan, rank) as group:
                for bucket in receive_weights(group, plan):
                    got.update({name: t.numpy().copy() for name, t in bucket})
        except PushAborted as err:
            got = str(err)
        results.put((plan.push_id, rank, got, groups.formed))


def test_a_kept_group_carries_many_pushes_and_a_receiver_without_it_calls_one_off():
    """Three pushes on one kept group form it once on every rank; the manifest travels once, through the
    sender's store (plans carry only its digest). A receiver process that restarted does not hold the group:
    the next push that reuses it is called off at the handshake (naming that rank), and the push after it,
    on a new group, reaches everyone."""
    import dataclasses

    from asyncrl.push.groups import BroadcastGroups, publish_manifest
    from asyncrl.push.rendezvous import ReceiversMissing

    store = host_store("127.0.0.1", 0, 30)
    metas = tensor_metas(weights(0))
    digest = publish_manifest(store, metas)
    sender = BroadcastGroups(store)
    base = PushPlan(push_id="p", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=3, transport="gloo", tensors=(), bucket_bytes=512, timeout_s=30, group_id="group-a",
                    manifest_digest=digest)  # fmt: skip
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    inboxes = {rank: ctx.Queue() for rank in (1, 2)}
    procs = {rank: ctx.Process(target=kept_group_receiver, args=(rank, inboxes[rank], results)) for rank in (1, 2)}
    for proc in procs.values():
        proc.start()

    def push(push_id, seed, new_group, group_id="group-a"):
        plan = dataclasses.replace(base, push_id=push_id, version=seed, new_group=new_group, group_id=group_id)
        for inbox in inboxes.values():
            inbox.put(plan)
        named = weights(seed)
        with sender.member(dataclasses.replace(plan, tensors=metas), 0) as group:
            send_weights(group, named, dataclasses.replace(plan, tensors=metas))
        got = {rank: (received, formed) for _, rank, received, formed in (results.get(timeout=60) for _ in range(2))}
        for rank, (received, _) in got.items():
            for name, tensor in named:
                assert torch.equal(torch.from_numpy(received[name]), tensor), (push_id, rank, name)
        return {rank: formed for rank, (_, formed) in got.items()}

    assert push("p1", 1, True) == {1: 1, 2: 1}
    assert push("p2", 2, False) == {1: 1, 2: 1}
    assert push("p3", 3, False) == {1: 1, 2: 1}
    assert sender.formed == 1

    inboxes[2].put(None)
    procs[2].join(30)
    procs[2] = ctx.Process(target=kept_group_receiver, args=(2, inboxes[2], results))
    procs[2].start()
    stale = dataclasses.replace(base, push_id="p4", version=4, new_group=False)
    for inbox in inboxes.values():
        inbox.put(stale)
    with pytest.raises(ReceiversMissing) as missing, sender.member(dataclasses.replace(stale, tensors=metas), 0):
        pass
    # It joined (it is reachable): the learner does not name it missing, the retry just forms a new group.
    assert missing.value.ranks == [2] and "not members" in str(missing.value) and not missing.value.absent
    called_off = [results.get(timeout=60) for _ in range(2)]
    assert all(isinstance(received, str) and "called off" in received for _, _, received, _ in called_off)

    assert push("p5", 5, True, group_id="group-b") == {1: 2, 2: 1}
    assert sender.formed == 2
    for inbox in inboxes.values():
        inbox.put(None)
    for proc in procs.values():
        proc.join(30)


def test_a_manifest_that_does_not_match_its_digest_is_refused():
    from asyncrl.core.checks.validation import InvalidArgument
    from asyncrl.push.groups import MANIFEST_KEY, ManifestCache, publish_manifest
    from asyncrl.push.manifest import manifest_bytes

    store = host_store("127.0.0.1", 0, 30)
    digest = publish_manifest(store, tensor_metas(weights(0)))
    plan = PushPlan(push_id="p", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=(), bucket_bytes=512, timeout_s=5, group_id="g", manifest_digest=digest)
    assert ManifestCache().resolve(plan, 1).tensors == tensor_metas(weights(0))
    store.set(MANIFEST_KEY.format(digest=digest), manifest_bytes(tensor_metas(weights(0)[:2]))[0])
    with pytest.raises(InvalidArgument) as refused:
        ManifestCache().resolve(plan, 1)
    assert refused.value.field == "plan.manifest_digest"


def test_a_pushs_verdict_outlives_its_broadcast_until_the_next_push():
    """The sender's broadcast can end (its bytes in socket buffers) before a slow receiver has read the
    verdict: the handshake keys of a push stay until the next push's broadcast is over, then go (the store
    stays small).
    A receiver that reads the verdict only after the sender finished still gets "go"."""
    import threading

    from asyncrl.push.broadcast import push_store
    from asyncrl.push.groups import BroadcastGroups
    from asyncrl.push.rendezvous import receiver_join

    store = host_store("127.0.0.1", 0, 30)
    sender, receiver = BroadcastGroups(store), BroadcastGroups()
    named = weights(0)
    plans = [PushPlan(push_id=f"v{k}", version=k, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1 << 20, timeout_s=30,
                      group_id="g", new_group=k == 1) for k in (1, 2)]

    def receive(plan):
        with receiver.member(plan, 1) as group:
            for _ in receive_weights(group, plan):
                pass

    for plan in plans:
        thread = threading.Thread(target=receive, args=(plan,))
        thread.start()
        with sender.member(plan, 0) as group:
            send_weights(group, named, plan)
        thread.join(30)
        keys = push_store(store, plan)
        assert keys.check(["verdict"])  # still there for a late reader
        receiver_join(keys, plan.push_id, 1, 5)  # reads "go", does not raise
    first = push_store(store, plans[0])
    assert not first.check(["verdict"]) and not first.check(["ready/1"])


def test_an_order_that_comes_late_gives_up_when_the_sender_moves_on():
    """A replica that was paused works through the UpdateWeights calls that queued up meanwhile, for pushes
    long over whose keys the sender has deleted. Each used to hold it for the push's data time-out (60 s),
    waiting for a verdict that would never come, so it missed every push after it resumed; now a late order
    gives up as soon as the sender announces its next push."""
    import threading
    import time

    from asyncrl.push.broadcast import connect_store, push_store
    from asyncrl.push.groups import BroadcastGroups
    from asyncrl.push.rendezvous import PushAborted, ReceiversMissing, receiver_join

    store = host_store("127.0.0.1", 0, 60)
    sender = BroadcastGroups(store)
    named = weights(0)
    plans = [PushPlan(push_id=f"v{k}", version=k, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1 << 20, timeout_s=60)
             for k in (1, 2, 3)]  # fmt: skip
    for plan in plans[:2]:  # the receiver is paused: both pushes are called off without it
        with pytest.raises(ReceiversMissing), sender.member(plan, 0, join_timeout_s=0.3):
            pass
    root = connect_store(plans[0])
    outcome = {}

    def late():
        t0 = time.monotonic()
        try:
            receiver_join(push_store(root, plans[0]), plans[0].push_id, 1, 60, root=root)
        except PushAborted as err:
            outcome.update(error=str(err), at=time.monotonic())
        outcome["waited"] = time.monotonic() - t0

    thread = threading.Thread(target=late)
    thread.start()  # v1's keys are gone (v2 began): no verdict will ever come for it
    time.sleep(1.0)
    assert thread.is_alive()  # it cannot tell a late order from an early one until the sender moves
    announced = time.monotonic()
    with pytest.raises(ReceiversMissing), sender.member(plans[2], 0, join_timeout_s=0.3):
        pass
    thread.join(10)
    assert "v1 is over: the sender has moved on to v3" in outcome["error"], outcome
    assert outcome["at"] - announced < 1.0 and outcome["waited"] < 3


def test_a_receiver_follows_a_sender_restarted_at_the_same_address():
    """A learner restarted as a container runtime restarts it: a new process at the same host and store port.
    The receiver's connection to the old store is dead (a broken pipe on first use); the next push reconnects
    and reaches it, instead of failing on the dead connection and leaving it out."""
    import dataclasses
    import gc

    from asyncrl.push.groups import BroadcastGroups, publish_manifest

    metas = tensor_metas(weights(0))
    ctx = mp.get_context("spawn")
    results, inbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=kept_group_receiver, args=(1, inbox, results))
    proc.start()

    def push(store, sender, push_id, seed, group_id):
        plan = PushPlan(push_id=push_id, version=seed, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2,
                        transport="gloo", bucket_bytes=512, timeout_s=30, group_id=group_id,
                        manifest_digest=publish_manifest(store, metas))
        inbox.put(plan)
        named = weights(seed)
        with sender.member(dataclasses.replace(plan, tensors=metas), 0) as group:
            send_weights(group, named, dataclasses.replace(plan, tensors=metas))
        _, _, received, _ = results.get(timeout=60)
        assert not isinstance(received, str), received
        assert all(torch.equal(torch.from_numpy(received[name]), tensor) for name, tensor in named)

    first = host_store("127.0.0.1", 0, 30)
    port, sender = first.port, BroadcastGroups(first)
    push(first, sender, "p1", 1, "group-a")
    sender.close()
    del first, sender
    gc.collect()  # the old learner is gone: its store stops listening
    restarted = host_store("127.0.0.1", port, 30)
    push(restarted, BroadcastGroups(restarted), "p2", 2, "group-b")
    inbox.put(None)
    proc.join(30)


def test_a_receiver_whose_sender_dies_mid_push_lets_go_at_once():
    """A learner killed while its replicas wait in its store for a push's verdict (the in-band follower waits
    there all the time). The receiver used to reconnect to the store's address and wait on: for the push's
    data time-out when nothing listened there any more, or, when the learner came back at the same address,
    until the new learner announced its second push. Meanwhile it held its one push at a time, and the new
    learner's pushes left it out again and again. Now the broken wait ends the push at once (`SenderLost`), and
    the receiver takes the next sender's push."""
    import gc
    import threading
    import time

    from asyncrl.push.groups import BroadcastGroups
    from asyncrl.push.rendezvous import SenderLost

    named = weights(0)
    metas = tensor_metas(named)
    dead = host_store("127.0.0.1", 0, 60)
    dead_address, dead_key = f"127.0.0.1:{dead.port}", dead.key
    receiver_side = BroadcastGroups()
    outcome = {}

    def wait_in_dead_push():
        plan = PushPlan(push_id="old", version=1, store_address=dead_address, store_key=dead_key, world_size=2,
                        transport="gloo", tensors=metas, bucket_bytes=1 << 20, timeout_s=60)
        try:
            with receiver_side.member(plan, 1):
                pass
        except Exception as err:  # noqa: BLE001 - the test looks at which
            outcome.update(error=err, at=time.monotonic())

    thread = threading.Thread(target=wait_in_dead_push)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive()  # joined, waiting for the sender's verdict
    died = time.monotonic()
    del dead
    gc.collect()  # the learner is gone: its store stops listening
    thread.join(20)
    assert isinstance(outcome.get("error"), SenderLost), outcome
    assert outcome["at"] - died < 2, outcome["at"] - died

    new = host_store("127.0.0.1", 0, 60)
    plan = PushPlan(push_id="new", version=2, store_address=f"127.0.0.1:{new.port}", store_key=new.key, world_size=2,
                    transport="gloo", tensors=metas, bucket_bytes=1 << 20, timeout_s=60)
    got = {}

    def take_new_push():
        with receiver_side.member(plan, 1) as group:
            for bucket in receive_weights(group, plan):
                got.update({name: t.clone() for name, t in bucket})

    thread = threading.Thread(target=take_new_push)
    thread.start()
    with BroadcastGroups(new).member(plan, 0, join_timeout_s=10) as group:
        send_weights(group, named, plan)
    thread.join(30)
    assert all(torch.equal(got[name], tensor) for name, tensor in named)


def test_an_order_from_a_sender_that_is_gone_is_refused_at_once():
    """An UpdateWeights order that reaches a replica after its learner died (queued behind a slow push, say)
    names a store nothing listens at: the receiver gives it up at its refused connect (`SenderGone`) instead of
    trying to connect for the push's time-out, twice."""
    import gc
    import time

    from asyncrl.push.groups import BroadcastGroups
    from asyncrl.push.store_gate import SenderGone

    gone = host_store("127.0.0.1", 0, 60)
    plan = PushPlan(push_id="late", version=1, store_address=f"127.0.0.1:{gone.port}", store_key=gone.key, world_size=2,
                    transport="gloo", tensors=tensor_metas(weights(0)), bucket_bytes=1 << 20, timeout_s=60)
    del gone
    gc.collect()
    started = time.monotonic()
    with pytest.raises(SenderGone, match="nothing listens at the sender's store"), BroadcastGroups().member(plan, 1):
        pass
    assert time.monotonic() - started < 2
