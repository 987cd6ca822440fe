"""Several runs' adapters served from one torch model (`asyncrl.core.engines.run_adapters`), with pushes over a
real gloo broadcast: each run serves exactly its own adapter (what the learner's peft model computes with that
run's adapter active), a batch keeps the adapter it started on however many pushes land meanwhile, and a run
refuses full weights without disturbing the others."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.engines.run_adapters import SLOTS_PER_RUN, FairSteps, SharedTorchModel
from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.learner.adapters import inject_adapters, lora_parameters, run_active
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.plan import PushPlan
from asyncrl.push.receiving import BroadcastReceiving
from asyncrl.push.transfer import send_weights

PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 4, 15]]
RUNS = {"a": SimpleNamespace(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]),
        "b": SimpleNamespace(rank=2, alpha=2.0, dropout=0.0, target_modules=["o_proj", "up_proj"])}


@pytest.fixture()
def shared(tiny_model_dir):
    targets = sorted({t for lora in RUNS.values() for t in lora.target_modules})
    model = SharedTorchModel(EngineConfig(threads=1, max_batch_size=8), str(tiny_model_dir.policy), "float32",
                             runs=len(RUNS), max_rank=4, targets=targets)
    for run in RUNS:
        model.add_run(run)
    engines = {run: model.engine_for(run, BroadcastReceiving(), seed=i) for i, run in enumerate(RUNS)}
    yield model, engines
    for engine in engines.values():
        engine.close()


@pytest.fixture()
def learner(tiny_model_dir):
    """The learner's side: the base with both runs' adapters (peft), each perturbed by its own seed."""
    model = load_causal_lm(tiny_model_dir.policy)
    specs = {run: inject_adapters(model, cfg, run=run) for run, cfg in RUNS.items()}
    return model, specs


@torch.no_grad()
def perturb(model, run: str, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    for _, p in lora_parameters(model, run):
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return [(name, p.detach().clone()) for name, p in lora_parameters(model, run)]


def push(engine, named, spec, version, plan_changes=None):
    """`named` pushed to `engine` as `version` over gloo (the sender on a thread); the engine's stats."""
    store = host_store("127.0.0.1", 0, 30.0)
    plan = PushPlan(push_id=f"p{version}-{id(named)}", version=version, store_address=f"127.0.0.1:{store.port}",
                    store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named),
                    bucket_bytes=1 << 20, timeout_s=30.0, adapter=spec, **(plan_changes or {}))
    errors = []

    def send():
        try:
            group = make_group(plan, 0, store)
            send_weights(group, named, plan)
            group.close()
        except Exception as err:  # noqa: BLE001 - surfaced by the test
            errors.append(err)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return engine.update_weights(plan, 1)
    finally:
        sender.join(30)
        assert not errors


def logprobs_of(engine_or_model, sequences, starts, run=None):
    if hasattr(engine_or_model, "score"):
        return engine_or_model.score(sequences, starts)
    with torch.no_grad(), run_active(engine_or_model, run):
        logp, _ = sequence_logprobs(engine_or_model, sequences, starts)
    return [row[: len(seq) - start] for row, seq, start in zip(logp.tolist(), sequences, starts)]


def test_before_its_first_push_a_run_generates_from_the_base(shared, tiny_model_dir):
    _model, engines = shared
    params = SamplingParams(max_new_tokens=5, greedy=True)
    base = load_causal_lm(tiny_model_dir.policy)
    for engine in engines.values():
        gens = [g for (g,) in engine.generate(PROMPTS, params)]
        assert all(set(g.weight_version) == {0} for g in gens)
        sequences = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
        starts = [len(p) for p in PROMPTS]
        with torch.no_grad():
            logits = [base(torch.tensor([s])).logits[0] for s in sequences]
        assert [g.token_ids for g in gens] == [
            lg[st - 1 : len(s) - 1].argmax(-1).tolist() for lg, s, st in zip(logits, sequences, starts)]


def test_each_run_serves_exactly_its_own_adapter(shared, learner):
    _model, engines = shared
    model, specs = learner
    sent = {"a": perturb(model, "a", 1), "b": perturb(model, "b", 2)}
    for version, run in ((1, "a"), (1, "b"), (2, "a")):
        if version == 2:
            sent["a"] = perturb(model, "a", 3)
        stats = push(engines[run], sent[run], specs[run], version)
        assert stats.version == engines[run].weight_version == version
        assert stats.adapter_checksum == engines[run].adapter_checksum == weights_checksum(sent[run])
    assert (engines["a"].weight_version, engines["b"].weight_version) == (2, 1)
    sequences = [p + [3, 7, 2] for p in PROMPTS]
    starts = [len(p) for p in PROMPTS]
    for run, engine in engines.items():
        want = logprobs_of(model, sequences, starts, run)
        got = logprobs_of(engine, sequences, starts)
        for w, g in zip(want, got):
            assert g == pytest.approx(w, abs=1e-5)
    # The two adapters do differ: a run served the other's would fail the check above.
    a, b = (logprobs_of(model, sequences, starts, run) for run in ("a", "b"))
    assert max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) > 1e-2


def test_a_batch_keeps_the_adapter_it_started_on_while_pushes_land(shared, learner):
    """Three pushes land during one long batch of run a: every token of it carries version 1 and is sampled
    from version 1's adapter; the next batch runs on the newest. With SLOTS_PER_RUN slots no push waited."""
    shared_model, engines = shared
    model, specs = learner
    engine = engines["a"]
    v1 = perturb(model, "a", 1)
    push(engine, v1, specs["a"], 1)
    eos_ids, shared_model.eos_ids = shared_model.eos_ids, [-1]  # never stop early: the batch runs all its steps
    started, pushed = threading.Event(), threading.Event()
    real_step = shared_model.steps.step

    @contextlib.contextmanager
    def slow_step(run):
        """Each forward held back until the pushes are done."""
        started.set()
        pushed.wait(30)
        with real_step(run):
            yield

    shared_model.steps.step = slow_step
    out = {}
    batch = threading.Thread(target=lambda: out.update(gens=engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=8), n=2)))
    batch.start()
    assert started.wait(30)
    for version in (2, 3, 4):
        assert push(engine, perturb(model, "a", version), specs["a"], version).version == version
    pushed.set()
    batch.join(60)
    shared_model.steps.step = real_step
    gens = [g for group in out["gens"] for g in group]
    assert all(set(g.weight_version) == {1} for g in gens)
    # Sampled from version 1's adapter: its log-probs, recomputed with v1 loaded on the learner's side.
    with torch.no_grad():
        for (name, p), (_, t) in zip(lora_parameters(model, "a"), v1):
            p.copy_(t)
    sequences = [p + g.token_ids for p, group in zip(PROMPTS, out["gens"]) for g in group]
    starts = [len(p) for p in PROMPTS for _ in range(2)]
    want = logprobs_of(model, sequences, starts, "a")
    for w, g in zip(want, gens):
        assert g.logp_behav == pytest.approx(w, abs=1e-4)
    assert engine.weight_version == 4 and SLOTS_PER_RUN == 3
    shared_model.eos_ids = eos_ids
    (after,) = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
    assert set(after[0].weight_version) == {4}


def test_full_weights_are_refused_and_the_run_serves_on(shared, learner, tiny_model_dir):
    _model, engines = shared
    model, specs = learner
    sent = perturb(model, "a", 1)
    push(engines["a"], sent, specs["a"], 1)
    full = named_weights(load_causal_lm(tiny_model_dir.teacher))
    with pytest.raises(ValueError, match="full weights"):
        push(engines["a"], full, None, 2)
    assert engines["a"].weight_version == 1 and engines["a"].adapter_checksum == weights_checksum(sent)
    assert engines["b"].weight_version == 0


def fair_steps(weights: dict[str, float]) -> FairSteps:
    steps = FairSteps()
    for run, weight in weights.items():
        steps.add(run, weight)
    return steps


def run_batches(steps: FairSteps, plan: dict[str, int], hold_s: float = 0.02) -> list[str]:
    """Each run of `plan` runs one batch of that many forwards on a thread of its own, each forward held
    `hold_s`; the order the forwards were granted in."""
    order, lock = [], threading.Lock()

    def batch(run: str, n: int) -> None:
        with steps.batch(run):
            for _ in range(n):
                with steps.step(run):
                    with lock:
                        order.append(run)
                    time.sleep(hold_s)

    threads = [threading.Thread(target=batch, args=item) for item in plan.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return order


def test_runs_get_forwards_by_their_weights_while_each_has_a_batch():
    order = run_batches(fair_steps({"a": 2.0, "b": 1.0}), {"a": 40, "b": 40})
    while_both = order[:45]  # a's 40 take about the first 60 forwards: both ask throughout these
    a, b = while_both.count("a"), while_both.count("b")
    assert len(order) == 80 and abs(a - 2 * b) <= 4, "".join(order)


def test_a_run_without_a_batch_lends_its_share_and_comes_back_level():
    """c runs alone first (a has nothing to do), then a joins: a gets no credit for the forwards it lent and the
    two alternate from then on."""
    steps = fair_steps({"a": 1.0, "c": 1.0})
    alone = run_batches(steps, {"c": 20})
    assert alone == ["c"] * 20
    both = run_batches(steps, {"a": 10, "c": 10})
    assert both.count("a") == both.count("c") == 10
    first_ten = both[:10]
    assert 4 <= first_ten.count("a") <= 6, "".join(both)  # level, not 20 forwards of a in a row


def test_a_run_that_leaves_frees_its_slots_for_the_next_and_a_full_bank_refuses_more(shared):
    model, engines = shared
    with pytest.raises(ValueError, match="adapter bank is full"):
        model.add_run("c")
    engines["b"].close()
    freed = model.slots["b"]
    model.remove_run("b")
    model.add_run("c")
    assert model.slots["c"] == freed and all(model.bank.ranks[slot] == 0 for slot in freed)
    with pytest.raises(ValueError, match="already has slots"):
        model.add_run("a")
