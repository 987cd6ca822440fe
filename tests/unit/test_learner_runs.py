"""The learner's base shared by several runs (`asyncrl.learner.runs.SharedBase`): a run's work runs with only that
run's adapter computing and having gradients, on the base's one thread, in the order it was asked for, one at a
time; the adapter is switched only when another run's work comes."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from asyncrl.learner.adapters import inject_adapters, lora_parameters, reset_adapter
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


def test_a_runs_work_sees_its_adapter_alone():
    base = shared_base()
    x = torch.ones(1, 4)

    def forward():
        trainable = {n for n, p in base.model.named_parameters() if p.requires_grad}
        return base.model(x), trainable

    outs = {}
    for run in ("a", "b", "c"):
        outs[run], trainable = base.run(run, forward)
        assert trainable == {n for n, p in base.model.named_parameters() if f".{run}." in n}
    # Each run's adapter changes the output by its own amount (0.1, 0.2, 0.3 in every entry of A and B).
    base_out = base.model.q_proj.base_layer(x)
    deltas = [(outs[run] - base_out).abs().max().item() for run in ("a", "b", "c")]
    assert deltas[0] < deltas[1] < deltas[2]
    with pytest.raises(ZeroDivisionError):  # the caller gets the work's exception
        base.run("a", lambda: 1 / 0)


def test_a_run_asked_again_after_a_change_to_the_model_gets_its_adapter_back():
    """The adapter stays active between one run's calls (a switch walks every layer); work on the model itself
    (run None: a run's adapter injected, which activates it) makes the next run's call switch again."""
    from asyncrl.learner.adapters import activate_run

    base = shared_base()

    def trainable():
        return {n for n, p in base.model.named_parameters() if p.requires_grad}

    a_only = {n for n, _ in base.model.named_parameters() if ".a." in n}
    assert base.run("a", trainable) == a_only
    assert base.run("a", trainable) == a_only
    base.run(None, activate_run, base.model, "c")  # as injecting run c leaves it active
    assert base.run("a", trainable) == a_only


def test_work_runs_on_one_thread_in_the_order_asked_one_at_a_time():
    base = shared_base()
    entered, inside, overlaps, threads_seen = [], [], [], set()
    first_in = threading.Event()

    def work(run: str) -> None:
        threads_seen.add(threading.get_ident())
        inside.append(run)
        if len(inside) > 1:  # somebody else's work ran meanwhile
            overlaps.append(list(inside))
        entered.append(run)
        if run == "a":
            first_in.set()
            time.sleep(0.2)  # b and c queue up behind
        inside.remove(run)

    threads = [threading.Thread(target=base.run, args=("a", work, "a"))]
    threads[0].start()
    assert first_in.wait(10)
    for run in ("c", "b", "c"):
        threads.append(threading.Thread(target=base.run, args=(run, work, run)))
        threads[-1].start()
        time.sleep(0.05)  # asked in this order
    for thread in threads:
        thread.join(10)
    assert entered == ["a", "c", "b", "c"] and not overlaps
    assert len(threads_seen) == 1 and threading.get_ident() not in threads_seen


def test_a_run_reset_starts_as_a_fresh_adapter_and_the_others_keep_theirs():
    """A run restarted with no checkpoint gets its adapter back as a fresh one starts (B = 0: the base's output;
    A drawn anew), the other runs' adapters untouched."""
    base = shared_base()
    x = torch.ones(1, 4)
    before = {run: base.run(run, base.model, x) for run in ("a", "b", "c")}
    base.run("b", reset_adapter, base.model, "b")
    params = dict(lora_parameters(base.model, "b"))
    assert sorted(name.rsplit(".", 2)[1] for name in params) == ["lora_A", "lora_B"]
    assert all(not p.any() for name, p in params.items() if ".lora_B." in name)
    assert all(p.abs().sum() > 0 and not torch.all(p == 0.2) for name, p in params.items() if ".lora_A." in name)
    assert torch.equal(base.run("b", base.model, x), base.model.q_proj.base_layer(x))
    for run in ("a", "c"):
        assert torch.equal(base.run(run, base.model, x), before[run])
    with pytest.raises(ValueError, match="no adapter named 'd'"):
        reset_adapter(base.model, "d")
