"""The controller's Prometheus metrics, on a per-instance registry.

prometheus_client's global REGISTRY refuses a second metric of the same name, and tests build several
controllers in one process, so each `ControllerState` owns its own `CollectorRegistry`; the status page
serves exactly that registry on /metrics.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from asyncrl.core.runtime.metrics import service_registry

PREFIX = "asyncrl_controller_"

# Holds are bounded by max_hold_s (seconds); pushes range from milliseconds (tiny model, loopback) to minutes.
_HOLD_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PUSH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, run: str = ""):
        self.registry = registry or service_registry("controller", run)
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
        self.prompts_regenerated = Counter(PREFIX + "prompts_regenerated",
                                           "Leases granted for the prompt of a group the learner dropped for its age "
                                           "(generated again).", registry=r)
        self.hard_prompt_replays = Counter(PREFIX + "hard_prompt_replays",
                                           "Leases granted for a hard prompt sampled again (controller.difficulty).",
                                           registry=r)
        self.hard_prompts = Gauge(PREFIX + "hard_prompts", "Prompts below controller.difficulty.hard_below that may "
                                  "still be sampled again.", registry=r)
        self.tracked_prompts = Gauge(PREFIX + "tracked_prompts", "Prompts with a pass-rate estimate.", registry=r)
        self.leases_expired = Counter(
            PREFIX + "leases_expired",
            "Leases expired (dead replica or TTL); each returned its quota.",
            registry=r,
        )
        self.pushes_committed = Counter(PREFIX + "pushes_committed", "Weight pushes committed.", registry=r)
        self.pushes_in_band = Counter(PREFIX + "pushes_in_band", "Weight pushes committed that the learner ordered "
                                      "through its store (no UpdateWeights calls).", registry=r)
        self.groups_formed = Counter(PREFIX + "broadcast_groups_formed",
                                     "Broadcast groups formed (the first push, and after each membership change "
                                     "or failure; other pushes reuse the group).", registry=r)
        self.replicas_dropped = Counter(
            PREFIX + "replicas_dropped",
            "Receivers dropped from a push (they then need a resync).",
            registry=r,
        )
        self.push_seconds = Histogram(
            PREFIX + "push_seconds", "BeginWeightPush to commit (a reserved push: from its start on the learner).", buckets=_PUSH_BUCKETS, registry=r
        )
        self.lease_hold_seconds = Histogram(
            PREFIX + "lease_hold_seconds",
            "Time an AcquireLease call waited before its answer (granted or not).",
            buckets=_HOLD_BUCKETS,
            registry=r,
        )

    def follow(self, snapshot: Callable[[], dict]) -> None:
        """Per-replica and lease series, computed from the controller's snapshot when scraped: one pass over
        the fleet per scrape instead of one per heartbeat."""
        self.registry.register(FleetCollector(snapshot))

    def exposition(self) -> bytes:
        """The Prometheus text format of this registry."""
        return generate_latest(self.registry)


class FleetCollector(Collector):
    """Series read off `ControllerState.snapshot()` at scrape time: each replica's weight version and its lag
    behind the committed version (labelled `replica`), leases outstanding and the admission ceiling."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot

    def collect(self):
        snap = self._snapshot()
        current = snap["current_version"]
        lag = GaugeMetricFamily(PREFIX + "replica_version_lag",
                                "Committed version minus the weight version the replica runs.", labels=["replica"])
        version = GaugeMetricFamily(PREFIX + "replica_weight_version", "Weight version the replica runs (-1 until a push reached it).",
                                    labels=["replica"])
        leases = GaugeMetricFamily(PREFIX + "replica_active_leases", "Leases the replica holds.", labels=["replica"])
        adapter = GaugeMetricFamily(PREFIX + "replica_adapter_verified",
                                    "1 when the weights (adapter or full) the replica reports serving are the ones "
                                    "the learner pushed for its version, 0 when not.", labels=["replica"])
        for replica in snap["replicas"]:
            if replica["alive"]:
                lag.add_metric([replica["replica_id"]], current - replica["weight_version"])
                version.add_metric([replica["replica_id"]], replica["weight_version"])
                leases.add_metric([replica["replica_id"]], replica["active_leases"])
                if replica.get("adapter_checksum"):
                    adapter.add_metric([replica["replica_id"]], float(replica["adapter_verified"]))
        yield lag
        yield version
        yield leases
        yield adapter
        yield GaugeMetricFamily(PREFIX + "active_leases", "Leases granted and not yet completed or expired.",
                                value=snap["active_leases"])
        if snap["max_admissible"] is not None:  # None: eta unbounded
            yield GaugeMetricFamily(PREFIX + "max_admissible_trajectories",
                                    "(i + eta + 1) * B: the ceiling N_r may reach at the committed version i.",
                                    value=snap["max_admissible"])

    def describe(self):
        return []  # collected lazily: nothing is read at registration
