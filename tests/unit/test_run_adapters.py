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
from asyncrl.core.engines.merged_decodes import DecodeCall, MergedDecodes
from asyncrl.core.engines.run_adapters import SLOTS_PER_RUN, SharedTorchModel
from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.learner.adapters import inject_adapters, lora_parameters, run_active
from asyncrl.push.broadcast import host_store
from asyncrl.push.plan import PushPlan
from asyncrl.push.receiving import BroadcastReceiving
from tests.unit.test_torch_engine import _sender

PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 4, 15]]
RUNS = {"a": SimpleNamespace(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]),
        "b": SimpleNamespace(rank=2, alpha=2.0, dropout=0.0, target_modules=["o_proj", "up_proj"])}


@pytest.fixture()
def shared(tiny_model_dir):
    targets = sorted({t for lora in RUNS.values() for t in lora.target_modules})
    model = SharedTorchModel(EngineConfig(threads=1, max_batch_size=8), str(tiny_model_dir.policy), "float32",
                             runs=len(RUNS), max_rank=4, targets=targets)
    with run_engines(model, RUNS) as engines:
        yield model, engines


@contextlib.contextmanager
def run_engines(model, runs):
    """Run -> `model`'s engine for it (each run added first, its pushes over gloo); afterwards every engine left
    in the mapping is closed, then the model. Shared by the torch bank's tests and vLLM's."""
    for run in runs:
        model.add_run(run)
    engines = {run: model.engine_for(run, BroadcastReceiving()) for run in runs}
    try:
        yield engines
    finally:
        for engine in engines.values():
            engine.close()
        model.close()


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
    sender = _sender(named, plan, store, errors)
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
    real_decode = shared_model.decode_batch

    def slow_decode(calls):
        """The batch held back until the pushes are done (its calls pinned already)."""
        started.set()
        pushed.wait(30)
        real_decode(calls)

    shared_model.decode_batch = slow_decode
    out = {}
    batch = threading.Thread(target=lambda: out.update(gens=engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=8), n=2)))
    batch.start()
    assert started.wait(30)
    for version in (2, 3, 4):
        assert push(engine, perturb(model, "a", version), specs["a"], version).version == version
    pushed.set()
    batch.join(60)
    shared_model.decode_batch = real_decode
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


class FakeDecoder:
    """A `decode_batch` that records each batch's calls, and holds the first until released."""

    def __init__(self):
        self.batches, self.release, self.first = [], threading.Event(), threading.Event()

    def __call__(self, calls):
        self.batches.append([c.prompts[0][0] for c in calls])
        if len(self.batches) == 1:
            self.first.set()
            assert self.release.wait(10)
        if any(c.prompts[0][0] < 0 for c in calls):
            raise RuntimeError("a poisoned batch")
        for c in calls:
            c.result = [[c.prompts[0][0]]] * len(c.prompts)


SAMPLED = SamplingParams(max_new_tokens=4)


def call(run, tag, rows=8, params=SAMPLED):
    return DecodeCall(run, [[tag]] * rows, params, 1, None, 1, 0)


def decode_all(decodes, decoder, calls, first):
    """`first` decoded (and held), then `calls` queued behind it one after another; every result."""
    results = {}

    def one(c):
        try:
            results[c.prompts[0][0]] = decodes.decode(c, decoder)
        except RuntimeError as err:
            results[c.prompts[0][0]] = str(err)

    threads = [threading.Thread(target=one, args=(first,))]
    threads[0].start()
    assert decoder.first.wait(10)
    for c in calls:
        threads.append(threading.Thread(target=one, args=(c,)))
        threads[-1].start()
        while c not in decodes._waiting:  # queued in this order
            time.sleep(0.001)
    decoder.release.set()
    for thread in threads:
        thread.join(10)
    return results


def merged(weights, max_rows=64):
    decodes = MergedDecodes(max_rows)
    for run, weight in weights.items():
        decodes.add(run, weight)
    return decodes


def test_calls_waiting_together_are_decoded_as_one_batch_while_they_fit():
    decoder = FakeDecoder()
    results = decode_all(merged({"a": 1, "b": 1, "c": 1}, max_rows=16), decoder,
                         [call("b", 2), call("c", 3), call("a", 4)], first=call("a", 1))
    # a's first call alone (nothing else waited). b and c come back level with a (no credit for the time they
    # asked for nothing), a goes first among equals: a and b fill 16 rows, c's call is the next batch.
    assert decoder.batches == [[1], [4, 2], [3]]
    assert results == {t: [[t]] * 8 for t in (1, 2, 3, 4)}


def test_calls_that_sample_differently_are_not_merged_and_a_failing_call_fails_alone():
    decoder = FakeDecoder()
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    results = decode_all(merged({"a": 1, "b": 1, "c": 1}), decoder,
                         [call("b", -2), call("c", 3, params=greedy), call("a", 4)], first=call("a", 1))
    # The merged batch of a and b fails on b's call: each is decoded again alone, and only b's fails.
    assert decoder.batches == [[1], [4, -2], [4], [-2], [3]]
    assert results[-2] == "a poisoned batch" and results[4] == [[4]] * 8 and results[3] == [[3]] * 8


def test_when_not_all_fit_the_runs_go_by_their_weights():
    """a (weight 2) and b always have a call waiting and one call fills a batch: two of a's to one of b's."""
    decoder = FakeDecoder()
    decodes = merged({"a": 2, "b": 1}, max_rows=8)
    queued = [call(run, 10 + 2 * i + (run == "b")) for i in range(6) for run in ("a", "b")]  # a even, b odd
    decode_all(decodes, decoder, queued, first=call("b", 1))
    order = ["a" if t % 2 == 0 else "b" for (t,) in decoder.batches[1:]]
    assert "".join(order[:9]) == "abaabaaba"  # b had its turn first: level, then two of a's to one of b's


def test_two_runs_decoded_together_sample_what_each_would_alone(shared, learner):
    shared_model, engines = shared
    model, specs = learner
    for version, run in ((1, "a"), (1, "b")):
        push(engines[run], perturb(model, run, 7 if run == "a" else 8), specs[run], version)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    alone = {run: engines[run].generate(PROMPTS, params) for run in engines}
    assert alone["a"] != alone["b"]  # the adapters differ enough to change greedy answers
    release, out = threading.Event(), {}
    real = shared_model.decode_batch

    def gated(calls):
        release.wait(10)
        real(calls)

    shared_model.decode_batch = gated
    blocker = threading.Thread(target=lambda: out.update(first=engines["a"].generate(PROMPTS[:1], params)))
    blocker.start()
    time.sleep(0.2)  # the blocker's decode holds the model: the next two calls wait together
    threads = [threading.Thread(target=lambda r=r: out.update({r: engines[r].generate(PROMPTS, params)}))
               for r in engines]
    for thread in threads:
        thread.start()
    while len(shared_model.decodes._waiting) < 2:
        time.sleep(0.001)
    release.set()
    for thread in [blocker, *threads]:
        thread.join(30)
    shared_model.decode_batch = real
    assert shared_model.decodes.merged[-1] == ("a", "b")
    for run in engines:
        assert [[g.token_ids for g in group] for group in out[run]] == [[g.token_ids for g in group]
                                                                        for group in alone[run]]
        assert all(set(g.weight_version) == {1} for group in out[run] for g in group)


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


def test_runs_that_ask_again_right_after_their_batch_are_decoded_together():
    """Each run's next call comes a moment after its last batch ended (its results written, leases taken): the
    free model waits that moment (MERGE_WINDOW of a decode) for the runs of the last batch, so two runs do not
    take turns alone."""
    decodes = merged({"a": 1, "b": 1})

    def slow(calls):
        time.sleep(0.04)
        for c in calls:
            c.result = [[c.prompts[0][0]]]

    def run(name):
        for i in range(12):
            decodes.decode(call(name, i, rows=1), slow)
            time.sleep(0.003)  # writing the results, asking for the next leases

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    together = sum(len(runs) == 2 for runs in decodes.merged)
    assert together >= 9 and len(decodes.merged) <= 15, decodes.merged
