"""The controller: the one authority on weight versions, admission (the staleness bound) and replicas.

Pure logic, no gRPC server in here (`services/controller_service.py` is the thin edge). Its loops, the
queue of held requests, and what unblocks each:

    rollout replicas                                    learner (RegisterLearner: the seat; its key rides on these)
      |  RegisterReplica / Heartbeat                      |  BeginWeightPush      CommitWeightPush
      |  AcquireLease(s) / CompleteLease(s)               |        |                     |
      v                                                   |        v                     v
  +---------------------------------- ControllerState (one lock + condition) ------------------------+
  |  ReplicaRegistry  (alive, weight_version, needs_sync)    PushCoordinator: PushSession (one open,  |
  |  LeaseBook        (N_r admitted, active leases, prompt cursor)  or one reserved at a commit)      |
  |  current_version i                                         receivers ranked 1..N                  |
  |                                                                       | fan-out: one thread per   |
  |  held AcquireLease(s) calls: coroutines ────────────┐                 | receiver, each calls      |
  |     (η rule forbids, or the replica needs sync;     │                 | Rollout.UpdateWeights     |
  |      at most min(wait_s, max_hold_s))               │                 | (in-band: none, the       |
  |                                                      │                 v learner relays the acks) |
  |                                                      │   commit waits for the acks (outside the   |
  |  the wakers wake them on:                            │   lock, bounded by push_timeout_s), drops  |
  |    - commit of version i+1 ◄─────────────────────────┤   the failed receivers (needs_sync),       |
  |    - a resync push reaching a replica ◄──────────────┤   commits i+1, may reserve i+2             |
  |    - quota returned: CompleteLease(s), written < n ◄─┤                                            |
  |    - quota returned: lease expired ◄─────────────────┘◄── reaper loop (timer thread, and lazily    |
  |                                                            in every operation): dead replicas,    |
  |                                                            expired leases                         |
  +---------------------------------------------------------------------------------------------------+
      |  events/controller.jsonl (controller.events)     |  status page /, /status, /metrics, /healthz

Modules: `staleness` (the rule), `registry`, `leases`, `books` (what every part shares: the lock, the clocks,
the registry and lease book, the push's `asyncrl.push.coordinator.PushCoordinator`, the version, the seat),
`state` (`ControllerState`: its collaborators built around the books, and the operations that span them:
registrations, pushes, timeline resets), and the collaborators: `admission` (granting leases, taking them
back), `held_request` (a request held as a coroutine, woken through `Admission.add_waker`), `learner_seat` and
`seating` (the learner's seat), `reachability` (new registrations challenged at their addresses before they
join pushes), `liveness` (reaping: dead replicas, due leases, the controller's own stalls forgiven);
`persistence` (the state kept in Redis across a controller restart), `reaper` (the timer thread,
the stall detector), `controller_metrics`, `views` and `status_page`. The
gRPC notifier that tells a replica to join a push is the push's own (`asyncrl.push.fanout`); the liveness
probes of a registered replica and of the seated learner are the service edge's
(`asyncrl.services.liveness_calls`); test fakes are in `tests/fakes.py`.
"""
