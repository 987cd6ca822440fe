"""The controller's event records (the sink types are `asyncrl.core.events`) in `<run_dir>/events/controller.jsonl` (`asyncrl.core.events.EventLog`).

Every record has `t` (unix seconds) and `kind`; the fields per kind are below. They are the audit trail:
from them one can check that every admission satisfied the staleness bound and that versions only grew.

`controller_started`: grpc, http (host:port each), eta, batch_size, start_version, start_admitted,
    start_prompt_index (written by `serve`; a resumed run starts at its checkpoint's version, so the audit
    reads each start as a new epoch of version ordering).
`replica_registered`: replica_id, address, weight_version, engine, needs_sync, current_version,
    reregistered (bool: the id was known, i.e. a restart; its old leases expire with reason "reregistered").
`replica_revived`: replica_id (a replica declared dead spoke again; its leases had already expired).
`replica_dead`: replica_id, silent_s, leases_expired (count); reason "unreachable" when a push found nothing
    listening at its address, "gone" when the controller's dial of a silent lease holder's address was
    refused (otherwise it was silent past the heartbeat time-out).
`lease_granted`: lease_id, replica_id, n, admitted_after (N_r after this admission, i.e. the N_r of the
    lease's last trajectory), version (policy version i at admission), eta (null = unbounded), batch_size,
    prompt_index, held_s.
    Audit: eta is null or floor((admitted_after - 1) / batch_size) <= version + eta.
`lease_completed`: lease_id, replica_id, n, num_written, returned (n - num_written), admitted_after.
`lease_expired`: lease_id, replica_id, n, returned (= n), admitted_after, reason ("ttl" | "max_age" |
    "replica_dead" | "reregistered" | "unreachable" | "gone" | "abandoned" | "timeline_reset").
`push_begun`: push_id, version, mode ("new" | "resync"; not `kind`, which names the record),
    receivers (replica ids, rank order), world_size, current_version (before the push),
    aborted_previous (push id or null), group_id, new_group, delta_base_push_id, in_band, reserved (opened at
    the previous commit for the learner, `CommitWeightPush.reserve_next`).
`push_committed`: push_id, version (the current version after the commit), mode, acked, dropped, seconds
    (from its Begin; for a reserved push, the learner's own measure up to its commit plus the commit), in_band.
    Audit: `version` never decreases from one record to the next and grows by exactly 1 on mode "new".
`push_aborted`: push_id, version, mode, reason (sender failure, time-out, or a reserved push superseded
    without being named unused); the version is not committed.
`push_withdrawn`: push_id, version, reason: a reserved push its learner dropped unused; nobody took it.
`replica_dropped`: push_id, replica_id, version (of the push), error.
`controller_stalled`: seconds, replicas, leases: the controller itself stood still that long (a reap came that
    much later than due); every replica's silence, lease age and the learner's silence were moved on by it.
`replica_reachable`: replica_id, address, failed_checks: it answered the controller's challenge at its address
    under its registration's key (after failed_checks that did not); from now on it joins pushes.
`learner_registered`: address, previous_address, current_version: the learner's seat changed hands.
`learner_refused`: address, reason: a RegisterLearner without a valid proof of the learner secret.
`replica_held_back`: replica_id, address, seconds, failures, problem: it sits out pushes for `seconds`
    (`controller.push_backoff_s`, doubling with `failures`) after it could not be reached, never joined a
    push, or never answered the controller's challenge at its address.
"""
