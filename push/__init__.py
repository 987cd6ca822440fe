"""The weight push, in one room: how a learner's new weights reach every rollout replica's engine.

    protocol.py     the controller's push state as data (phases, events, the transition table) and the routes
    plan.py         `PushOffer` (what the learner asks for) and `PushPlan` (what every receiver joins), each
                    with its one converter to and from its proto message
    manifest.py     the wire form of a push's tensor list and its structural checks
    sender.py       the learner's side: plan -> broadcast as rank 0 -> commit (`WeightPublisher`)
    coordinator.py  the controller's side: receivers, groups, reservations, commits (`PushCoordinator`)
    session.py      one push in the controller's hands: receivers and their outcomes
    fanout.py       the controller's UpdateWeights calls for the pushes it orders
    in_band.py      orders and acks through the learner's store, for the pushes the learner orders
    receiver.py     the replica's side: signed orders taken, in-band orders followed (`PushReceiver`)
    receiving.py    what an engine receives through (`BroadcastReceiving`, the contract's `WeightSource`)
    vllm_worker.py  the same inside vLLM's worker processes (the worker extension)
    broadcast.py    the data plane's groups: a broadcast group (gloo, NCCL) with rank 0 = the learner, its store
    transfer.py     a push's bytes over a group, bucket by bucket, whole or as sparse deltas
    groups.py       the group kept across pushes while the membership holds, and the manifest in the store
    rendezvous.py   the join handshake in front of every broadcast
    deltas.py       sparse delta buckets: what changed since the version every receiver holds
    buckets.py, flat.py, staging.py
                    the bucket layout the weights travel in, storage of that layout, reused staging buffers

The types the push shares with the engines (tensor metadata, the transport choice, the receiver's interface,
the stats) are the push contract's, `asyncrl.core.wire.push_contract`: the engines implement the receiver's
side against it and import nothing from here.

The roles only call in: the learner's loop pushes through `WeightPublisher`, the controller's state holds a
`PushCoordinator`, the rollout service hands UpdateWeights to `PushReceiver`. docs/architecture.md, "Weight
push", tells the handshake step by step.
"""
