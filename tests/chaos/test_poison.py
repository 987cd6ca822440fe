"""Poison: bad entries written straight into the live trajectory stream of a running demo (the learner mid-run)
are dead-lettered with their reasons, never trained on and never a crash; the run completes all its steps and audits
clean, and the final weights are finite. On the way: nothing of the run listens beyond loopback."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import redis
import torch
import yaml

from asyncrl.core.runtime.events import read_events
from asyncrl.v1 import trajectory_pb2
from tests.run_helpers import demo_args, listening_sockets, process_tree, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

REPO = Path(__file__).resolve().parents[2]
STEPS, INJECT_AT = 120, 10
"""The poison goes in at step 10 and must be read before the run ends: at about 45 ms per step, 110 steps leave
the learner five seconds (the injection itself takes under one)."""


def poison(group_size: int, vocab_size: int) -> dict[str, tuple[dict, str]]:
    """name -> (stream fields, a fragment of the reason the learner must give)."""

    def group(change=None) -> bytes:
        trajs = [trajectory_pb2.Trajectory(trajectory_id=f"poison/{j}", group_id="poison", prompt_token_ids=[1, 5, 6],
                                           response_token_ids=[7, 8, 2], logp_behav=[-0.1, -0.2, -0.3],
                                           weight_version=[0, 0, 0], reward=1.0)
                 for j in range(group_size)]
        g = trajectory_pb2.TrajectoryGroup(group_id="poison", trajectories=trajs)
        if change:
            change(g.trajectories[3], g)
        return g.SerializeToString()

    def set_list(field, values):
        def change(t, _g):
            del getattr(t, field)[:]
            getattr(t, field).extend(values)
        return change

    def set_value(field, value):
        return lambda t, _g: setattr(t, field, value)

    payload = lambda change: {b"g": group(change)}
    return {
        "random bytes": ({b"g": os.urandom(200)}, "not a TrajectoryGroup"),
        "missing payload": ({b"x": b"1"}, "no payload"),
        "mismatched lengths": (payload(set_list("logp_behav", [-0.1])), "logp_behav"),
        "token beyond the vocabulary": (payload(set_list("response_token_ids", [7, vocab_size + 3, 2])), "vocabulary"),
        "NaN log-prob": (payload(set_list("logp_behav", [-0.1, math.nan, -0.3])), "non-finite"),
        "+inf log-prob": (payload(set_list("logp_behav", [math.inf, -0.2, -0.3])), "non-finite"),
        "-inf log-prob": (payload(set_list("logp_behav", [-0.1, -math.inf, -0.3])), "non-finite"),
        "positive log-prob": (payload(set_list("logp_behav", [-0.1, 2.5, -0.3])), "> 0"),
        "NaN reward": (payload(set_value("reward", math.nan)), "reward nan"),
        "huge reward": (payload(set_value("reward", 3e38)), "reward.max_abs"),
        "future version": (payload(set_list("weight_version", [0, 0, 10**9])), "from the future"),
        "oversized group": (payload(lambda _t, g: g.trajectories.append(g.trajectories[0])), "group_size"),
    }


def test_poisoned_entries_are_dead_lettered_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    args = demo_args(run_dir, STEPS, "learner.eval_every=30", f"learner.checkpoint.save_every={STEPS}")
    with running_up(*args) as proc:
        wait_for(lambda: steps_done(run_dir) >= INJECT_AT, 300, f"{INJECT_AT} learner steps")
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
        # The run's redis-server wants the password `up` made for it; without it, writing is refused.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(config["buffer"]["redis_url"]).ping()
        password = (run_dir / "redis-password").read_text().strip()
        client = redis.Redis.from_url(config["buffer"]["redis_url"], password=password)
        vocab = yaml.safe_load((REPO / config["model"]["path"] / "config.json").read_text())["vocab_size"]
        kinds = poison(config["sampling"]["group_size"], vocab)
        injected = {client.xadd(config["buffer"]["stream"], fields).decode(): (name, fragment)
                    for name, (fields, fragment) in kinds.items()}

        def rejected() -> dict:
            return {e["entry_id"]: e["reason"] for e in read_events(run_dir, "learner")
                    if e["kind"] == "group_rejected"}

        wait_for(lambda: set(injected) <= set(rejected()), 120, "every poisoned entry to be dead-lettered")
        reasons = rejected()
        for entry_id, (name, fragment) in injected.items():
            assert fragment in reasons[entry_id], f"{name}: {reasons[entry_id]}"
        # Local mode listens on loopback only: every socket of every process of the run (the learner's
        # rendezvous store too, which TCPStore alone would open on all interfaces).
        sockets = listening_sockets(process_tree(proc.pid))
        assert len(sockets) >= 8 and all(loopback for _, loopback in sockets), sockets
        dead = client.xrange(config["buffer"]["dead_letter_stream"])
        assert {f[b"entry_id"].decode() for _id, f in dead} >= set(injected)
        assert all(f[b"reason"] for _id, f in dead)
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "[up] audit OK" in out, out[-3000:]
    learner = read_events(run_dir, "learner")
    assert sum(e["kind"] == "step" for e in learner) == STEPS
    assert not any(e["kind"] == "trained" and "poison" in e["group_ids"] for e in learner)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "hf"))
    assert all(torch.isfinite(p).all() for p in model.parameters())
