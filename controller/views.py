"""How the status page, /status and GetStatus show the controller's parts (plain, JSON-able dicts)."""

from __future__ import annotations

from asyncrl.controller.registry import Replica
from asyncrl.controller.results import LearnerReport


def replica_view(replica: Replica, now: float, current: int, active_leases: int, pushed_adapter: str = "") -> dict:
    """`held_back_s`: how much longer it sits out pushes after failing some, or failing to answer at its
    address (`push_problem`: why); `reachable`: it answered there (until then it joins no push);
    `dead_reason`: why it was declared dead ("" while alive); `adapter_checksum`: the checksum of the weights
    (adapter or full) it reports serving, `adapter_verified`: they are the ones the learner pushed for its
    version (`pushed_adapter`)."""
    return {
        "replica_id": replica.replica_id,
        "address": replica.address,
        "weight_version": replica.weight_version,
        "alive": replica.alive,
        "dead_reason": replica.dead_reason,
        "needs_sync": replica.needs_sync(current),
        "active_leases": active_leases,
        "last_heartbeat_age_s": replica.heartbeat_age(now),
        "engine": replica.engine,
        "held_back_s": max(0.0, replica.held_back_until - now),
        "push_problem": replica.push_problem,
        "reachable": replica.reachable,
        "adapter_checksum": replica.adapter_checksum,
        "adapter_verified": bool(pushed_adapter) and replica.adapter_checksum == pushed_adapter,
    }


def learner_view(report: LearnerReport, now: float, batch_size: int, address: str = "") -> dict:
    """The learner's last report as the status page shows it, with the ETA and the throughput (trajectories
    trained per second of wall time) from its last step time; `address`: where the learner holding the seat
    serves its status."""
    view = {"step": report.step, "version": report.version, "consumed": report.consumed,
            "heartbeat_age_s": now - report.at, "address": address}
    figures = report.progress
    if figures is not None:
        view.update(figures.values, total_steps=figures.total_steps)
        step_seconds = figures.get("step_seconds")
        if step_seconds:
            view["trajectories_per_s"] = batch_size / step_seconds
            if figures.total_steps > report.step:
                view["eta_s"] = step_seconds * (figures.total_steps - report.step)
    return view
