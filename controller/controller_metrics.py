"""The controller's Prometheus metrics, on a per-instance registry.

prometheus_client's global REGISTRY refuses a second metric of the same name, and tests build several
controllers in one process, so each `ControllerState` owns its own `CollectorRegistry`; the status page
serves exactly that registry on /metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from asyncrl.core.metrics import service_registry

PREFIX = "asyncrl_controller_"

# Holds are bounded by max_hold_s (seconds); pushes range from milliseconds (tiny model, loopback) to minutes.
_HOLD_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PUSH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or service_registry("controller")
        r = self.registry
        self.current_version = Gauge(PREFIX + "current_version", "Committed policy version i.", registry=r)
        self.admitted_trajectories = Gauge(
            PREFIX + "admitted_trajectories",
            "N_r: trajectories admitted so far, net of returned quota.",
            registry=r,
        )
        self.held_requests = Gauge(
            PREFIX + "held_requests",
            "AcquireLease calls held by the staleness bound or a pending sync.",
            registry=r,
        )
        self.live_replicas = Gauge(
            PREFIX + "live_replicas", "Rollout replicas with a recent heartbeat.", registry=r
        )
        self.leases_granted = Counter(PREFIX + "leases_granted", "Leases granted.", registry=r)
        self.leases_expired = Counter(
            PREFIX + "leases_expired",
            "Leases expired (dead replica or TTL); each returned its quota.",
            registry=r,
        )
        self.pushes_committed = Counter(PREFIX + "pushes_committed", "Weight pushes committed.", registry=r)
        self.replicas_dropped = Counter(
            PREFIX + "replicas_dropped",
            "Receivers dropped from a push (they then need a resync).",
            registry=r,
        )
        self.push_seconds = Histogram(
            PREFIX + "push_seconds", "BeginWeightPush to commit.", buckets=_PUSH_BUCKETS, registry=r
        )
        self.lease_hold_seconds = Histogram(
            PREFIX + "lease_hold_seconds",
            "Time an AcquireLease call waited before its answer (granted or not).",
            buckets=_HOLD_BUCKETS,
            registry=r,
        )

    def exposition(self) -> bytes:
        """The Prometheus text format of this registry."""
        return generate_latest(self.registry)
