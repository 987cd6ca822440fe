"""`asyncrl grafana-dashboard`: the Grafana dashboard of a run, generated from one list of panels.

deploy/grafana/dashboards/asyncrl.json is this module's output (tests/unit/test_dashboard.py keeps the two
equal; the Prometheus e2e test checks every query against a real scrape). Queries use the scrape jobs'
names (`job`: controller, teacher, rollout, learner) as deploy/prometheus/prometheus.yml sets them; the
`replica` label comes from the series themselves.
"""

from __future__ import annotations

import json

from asyncrl.learner.busy import WINDOW_STEPS

DATASOURCE = {"type": "prometheus", "uid": "asyncrl-prometheus"}
"""The datasource deploy/grafana/provisioning/datasources/prometheus.yaml provisions (same uid)."""

RATE = "[1m]"


def _q(quantile: float, histogram: str, by: str = "") -> str:
    by_clause = f"le, {by}" if by else "le"
    return f"histogram_quantile({quantile}, sum by ({by_clause}) (rate({histogram}_bucket{RATE})))"


# (row, [(title, unit, [(expression, legend)])]): one entry per panel.
PANELS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Learner", [
        ("Learner step and policy version", "none", [
            ("asyncrl_learner_step", "step"), ("asyncrl_controller_current_version", "committed version")]),
        ("Reward and held-out accuracy", "percentunit", [
            ("asyncrl_learner_reward_mean", "reward (batch mean)"),
            ("asyncrl_learner_eval_accuracy", "held-out greedy accuracy")]),
        ("Staleness (versions)", "none", [
            (_q(0.5, "asyncrl_learner_staleness_versions"), "p50"),
            (_q(0.99, "asyncrl_learner_staleness_versions"), "p99"),
            ("asyncrl_learner_staleness_mean", "last batch mean")]),
        ("Training throughput", "short", [
            (f"rate(asyncrl_learner_trajectories_consumed_total{RATE})", "trajectories/s"),
            (f"rate(asyncrl_learner_tokens_trained_total{RATE})", "tokens/s")]),
        ("Learner busy: share of the wall time in train steps", "percentunit", [
            ("asyncrl_learner_busy_ratio", f"last {WINDOW_STEPS} steps"),
            (f"rate(asyncrl_learner_step_seconds_sum{RATE})", "last minute")]),
        ("Step, push and checkpoint time", "s", [
            (_q(0.5, "asyncrl_learner_step_seconds"), "step p50"),
            (_q(0.5, "asyncrl_learner_push_seconds"), "push p50 (learner)"),
            (_q(0.5, "asyncrl_learner_push_wait_seconds"), "push on the learner's path p50"),
            (_q(0.99, "asyncrl_controller_push_seconds"), "push p99 (start..commit, at the controller)"),
            # Checkpoints are rare (every save_every steps): the mean over a longer window than the rates'.
            ("rate(asyncrl_learner_checkpoint_stall_seconds_sum[10m]) / rate(asyncrl_learner_checkpoint_stall_seconds_count[10m])",
             "checkpoint stall (mean, 10 min)")]),
        ("Weights pushed", "Bps", [(f"rate(asyncrl_learner_push_bytes_total{RATE})", "bytes/s")]),
        ("Rollout correction and mismatch", "none", [
            ("asyncrl_learner_kl_behav_prox", "KL(behav||prox) k3"),
            ('asyncrl_learner_diagnostic{name=~"rc/ratio_max|rc/ess_token|rc/masked_token_frac|rc/delta_abs_mean"}',
             "{{name}}")]),
        ("Response length: correct, incorrect, easy and hard prompts", "none", [
            ('asyncrl_learner_diagnostic{name=~"length/correct_mean|length/incorrect_mean|length/easy_mean|length/hard_mean"}',
             "{{name}}")]),
        ("Truncation and how the loss weighs long responses", "none", [
            ('asyncrl_learner_diagnostic{name=~"length/truncated_frac|length/token_weight_long_vs_short|length/token_weight_incorrect_vs_correct"}',
             "{{name}}")]),
        ("PPO clipping and gradient", "none", [
            ('asyncrl_learner_diagnostic{name=~"loss/clip_frac|loss/ratio_max|opt/grad_norm"}', "{{name}}")]),
        ("Refused and skipped", "short", [
            (f"increase(asyncrl_learner_dead_letters_total{RATE})", "dead-lettered"),
            (f"increase(asyncrl_learner_skipped_updates_total{RATE})", "updates skipped (non-finite)"),
            (f"increase(asyncrl_learner_teacher_failures_total{RATE})", "batches without the teacher")]),
    ]),
    ("Buffer", [
        ("Buffer depth (groups)", "short", [
            ("asyncrl_buffer_backlog_groups", "waiting"), ("asyncrl_buffer_pending_groups", "delivered, unacked")]),
        ("Age of a group when trained", "s", [
            (_q(0.5, "asyncrl_learner_group_age_seconds"), "p50"),
            (_q(0.9, "asyncrl_learner_group_age_seconds"), "p90")]),
    ]),
    ("Controller", [
        ("Admission: N_r against its ceiling", "short", [
            ("asyncrl_controller_admitted_trajectories", "N_r admitted"),
            ("asyncrl_controller_max_admissible_trajectories", "(i + eta + 1) B")]),
        ("Leases", "short", [
            ("asyncrl_controller_held_requests", "held requests"),
            ("asyncrl_controller_active_leases", "active leases"),
            (f"rate(asyncrl_controller_leases_granted_total{RATE})", "granted/s"),
            (f"rate(asyncrl_controller_leases_expired_total{RATE})", "expired/s")]),
        ("Replica version lag", "none", [
            ("asyncrl_controller_replica_version_lag", "{{replica}}"),
            ("asyncrl_controller_live_replicas", "live replicas")]),
        ("Lease hold time p99", "s", [(_q(0.99, "asyncrl_controller_lease_hold_seconds"), "p99")]),
    ]),
    ("Rollout", [
        ("Tokens generated per replica", "short", [
            (f"sum by (replica) (rate(asyncrl_rollout_tokens_generated_total{RATE}))", "{{replica}}")]),
        ("Groups written and rejected", "short", [
            (f"sum by (replica) (rate(asyncrl_rollout_groups_written_total{RATE}))", "written {{replica}}"),
            (f"sum by (replica) (rate(asyncrl_rollout_groups_rejected_total{RATE}))", "rejected {{replica}}")]),
        ("Reward per replica", "percentunit", [("asyncrl_rollout_reward_mean", "{{replica}}")]),
        ("Weight version per replica", "none", [("asyncrl_rollout_weight_version", "{{replica}}")]),
        ("Weight update pause and lease wait p90", "s", [
            (_q(0.9, "asyncrl_rollout_weight_update_pause_seconds", "replica"), "pause {{replica}}"),
            (_q(0.9, "asyncrl_rollout_lease_wait_seconds", "replica"), "lease wait {{replica}}")]),
        ("Reward errors", "short", [
            (f"sum by (kind) (increase(asyncrl_rollout_reward_errors_total{RATE}))", "{{kind}}")]),
    ]),
    ("Episodes (environment.type set)", [
        ("Episodes ended by reason", "short", [
            (f"sum by (reason) (rate(asyncrl_rollout_episodes_ended_total{RATE}))", "{{reason}}")]),
        ("Tool calls by tool and outcome", "short", [
            (f"sum by (tool, outcome) (rate(asyncrl_rollout_tool_calls_total{RATE}))", "{{tool}} {{outcome}}")]),
        ("Environment call and generation round p90", "s", [
            (_q(0.9, "asyncrl_rollout_environment_seconds"), "environment call"),
            (_q(0.9, "asyncrl_rollout_generation_seconds"), "generation round")]),
        ("Turns and tokens per episode p50", "short", [
            (_q(0.5, "asyncrl_rollout_episode_turns"), "turns"),
            (_q(0.5, "asyncrl_rollout_episode_tokens"), "tokens")]),
        ("Episodes in flight", "short", [("asyncrl_rollout_episodes_in_flight", "{{replica}}")]),
    ]),
    ("Teacher", [
        ("Teacher tokens scored", "short", [(f"rate(asyncrl_teacher_tokens_scored_total{RATE})", "tokens/s")]),
        ("Score time p90", "s", [(_q(0.9, "asyncrl_teacher_score_seconds"), "p90")]),
    ]),
    ("gRPC and processes", [
        ("RPC errors by method", "short", [
            (f'sum by (job, grpc_method, grpc_code) (rate(grpc_server_handled_total{{grpc_code!="OK"}}{RATE}))',
             "{{job}} {{grpc_method}} {{grpc_code}}")]),
        ("RPC latency p99 by method", "s", [
            (_q(0.99, "grpc_server_handling_seconds", "job, grpc_method"), "{{job}} {{grpc_method}}")]),
        ("CPU per process", "percentunit", [
            (f"rate(process_cpu_seconds_total{RATE})", "{{job}} {{instance}}")]),
        ("Resident memory per process", "bytes", [("process_resident_memory_bytes", "{{job}} {{instance}}")]),
        ("Targets up", "none", [("up", "{{job}} {{instance}}")]),
    ]),
]


def build() -> dict:
    """The dashboard as Grafana's JSON model (schemaVersion 39): rows of 8-wide time series panels."""
    panels, y, next_id = [], 0, 1
    for row_title, row_panels in PANELS:
        panels.append({"id": next_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id, y = next_id + 1, y + 1
        for i, (title, unit, queries) in enumerate(row_panels):
            panels.append({
                "id": next_id, "type": "timeseries", "title": title, "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": 8, "x": 8 * (i % 3), "y": y + 8 * (i // 3)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [{"refId": chr(ord("A") + k), "datasource": DATASOURCE, "expr": expr,
                             "legendFormat": legend} for k, (expr, legend) in enumerate(queries)],
            })
            next_id += 1
        y += 8 * ((len(row_panels) + 2) // 3)
    return {
        "uid": "asyncrl-run", "title": "asyncrl run", "tags": ["asyncrl"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser", "panels": panels, "templating": {"list": []}, "annotations": {"list": []},
    }


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression in a dashboard."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"
