"""The weight push, in one room: how a learner's new weights reach every rollout replica's engine.

    protocol.py     the controller's push state as data (phases, events, the transition table) and the routes
    plan.py         `PushOffer` (what the learner asks for) and `PushPlan` (what every receiver joins), each
                    with its one converter to and from its proto message
    manifest.py     the tensor list of a push, its wire form and its checks against a model
    sender.py       the learner's side: plan -> broadcast as rank 0 -> commit (`WeightPublisher`)
    coordinator.py  the controller's side: receivers, groups, reservations, commits (`PushCoordinator`)
    session.py      one push in the controller's hands: receivers and their outcomes
    fanout.py       the controller's UpdateWeights calls for the pushes it orders
    in_band.py      orders and acks through the learner's store, for the pushes the learner orders
    receiver.py     the replica's side: signed orders taken, in-band orders followed (`PushReceiver`)
    transport/      the data plane: broadcast groups (gloo, NCCL), the join handshake, buckets, flat storage

The roles only call in: the learner's loop pushes through `WeightPublisher`, the controller's state holds a
`PushCoordinator`, the rollout service hands UpdateWeights to `PushReceiver`. docs/architecture.md, "Weight
push", tells the handshake step by step.
"""
