"""The learner's base shared by several runs (`asyncrl.learner.runs.SharedBase`): inside a run's turn only that
run's adapter computes and has gradients; turns go in the order they were asked for, one at a time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from asyncrl.learner.adapters import inject_adapters, lora_parameters
from asyncrl.learner.runs import SharedBase


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.q_proj(x)


def shared_base() -> SharedBase:
    torch.manual_seed(0)
    model = Tiny()
    for i, run in enumerate(("a", "b", "c")):
        inject_adapters(model, SimpleNamespace(rank=2, alpha=2.0, dropout=0.0, target_modules=["q_proj"]), run=run)
        with torch.no_grad():
            for _, p in lora_parameters(model, run):
                p.fill_(0.1 * (i + 1))
    return SharedBase(model)


def test_a_turn_is_one_runs_adapter_alone():
    base = shared_base()
    x = torch.ones(1, 4)
    outs = {}
    for run in ("a", "b", "c"):
        with base.turn(run):
            outs[run] = base.model(x)
            trainable = {n for n, p in base.model.named_parameters() if p.requires_grad}
            assert trainable == {n for n, p in base.model.named_parameters() if f".{run}." in n}
    # Each run's adapter changes the output by its own amount (0.1, 0.2, 0.3 in every entry of A and B).
    base_out = base.model.q_proj.base_layer(x)
    deltas = [(outs[run] - base_out).abs().max().item() for run in ("a", "b", "c")]
    assert deltas[0] < deltas[1] < deltas[2]


def test_turns_are_granted_in_the_order_asked_one_at_a_time():
    base = shared_base()
    entered, inside, overlaps = [], [], []
    first_in = threading.Event()

    def take(run: str) -> None:
        with base.turn(run):
            inside.append(run)
            if len(inside) > 1:  # somebody else held the base meanwhile
                overlaps.append(list(inside))
            entered.append(run)
            if run == "a":
                first_in.set()
                time.sleep(0.2)  # b and c queue up behind
            inside.remove(run)

    threads = [threading.Thread(target=take, args=("a",))]
    threads[0].start()
    assert first_in.wait(10)
    for run in ("c", "b", "c"):
        threads.append(threading.Thread(target=take, args=(run,)))
        threads[-1].start()
        time.sleep(0.05)  # asked in this order
    for thread in threads:
        thread.join(10)
    assert entered == ["a", "c", "b", "c"] and not overlaps
