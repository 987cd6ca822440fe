"""TorchEngine: cached decoding equals uncached forwards, logp_behav equals the learner's log-probs, EOS,
in-flight weight updates over a real gloo broadcast, and rejected plans."""

import dataclasses
import threading

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import EngineConfig
from asyncrl.core.engines.torch_engine import TorchEngine
from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import TensorMeta, tensor_metas
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.plan import PushPlan
from asyncrl.push.receiving import BroadcastReceiving
from asyncrl.push.transfer import send_weights

# Variable prompt lengths on purpose: left padding must not change anything.
PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 12, 13, 14, 4, 15], [1, 4, 15]]


@pytest.fixture()
def engine(tiny_model_dir):
    eng = TorchEngine(
        EngineConfig(threads=1, max_batch_size=5), str(tiny_model_dir.policy), seed=3, version=7,
        weights=BroadcastReceiving(),
    )
    yield eng
    eng.close()


def _flat(groups):
    return [g for group in groups for g in group]


def test_greedy_is_deterministic_and_equals_uncached_argmax(engine):
    params = SamplingParams(max_new_tokens=6, greedy=True)
    first = engine.generate(PROMPTS, params, n=2)
    assert engine.generate(PROMPTS, params, n=2) == first
    for prompt, group in zip(PROMPTS, first):
        # Same tokens in another batch slot; the log-prob may differ in the last float bits only.
        assert group[0].token_ids == group[1].token_ids
        assert group[0].logp_behav == pytest.approx(group[1].logp_behav, abs=1e-5)
        gen = group[0]
        assert gen.weight_version == [7] * len(gen.token_ids)
        # Replay without a cache: each generated token is the argmax of a full forward of everything before.
        seq = prompt + gen.token_ids
        with torch.no_grad():
            logits = engine.model(torch.tensor([seq])).logits[0]
        argmax = logits[len(prompt) - 1 : len(seq) - 1].argmax(-1).tolist()
        assert argmax == gen.token_ids


@pytest.mark.parametrize(
    "params",
    [SamplingParams(max_new_tokens=6), SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=6)],
)
def test_logp_behav_equals_sequence_logprobs(engine, params):
    gens = _flat(engine.generate(PROMPTS, params, n=3))
    prompts = [p for p in PROMPTS for _ in range(3)]
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            engine.model,
            [p + g.token_ids for p, g in zip(prompts, gens)],
            [len(p) for p in prompts],
            params,
            0,
        )
    for i, gen in enumerate(gens):
        assert len(gen.logp_behav) == len(gen.token_ids) == int(mask[i].sum())
        assert gen.logp_behav == pytest.approx(logp[i, : len(gen.token_ids)].tolist(), abs=1e-5)


def test_sampling_is_seeded(tiny_model_dir):
    params = SamplingParams(max_new_tokens=5)
    runs = []
    for seed in (11, 11, 12):
        eng = TorchEngine(EngineConfig(threads=1), str(tiny_model_dir.policy), seed=seed, weights=BroadcastReceiving())
        runs.append([g.token_ids for g in _flat(eng.generate(PROMPTS, params, n=4))])
    assert runs[0] == runs[1] != runs[2]


def test_eos_stops_each_sequence(engine):
    eos = engine.eos_ids[0]
    params = SamplingParams(max_new_tokens=8)
    for gen in _flat(engine.generate(PROMPTS, params, n=16)):
        if gen.finished:
            assert gen.token_ids[-1] == eos and eos not in gen.token_ids[:-1]
        else:
            assert len(gen.token_ids) == 8 and eos not in gen.token_ids
    # Make the greedy first token of one prompt the EOS: that sequence stops after one token, the
    # others in the same batch go on.
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    before = engine.generate(PROMPTS, greedy)
    engine.eos_ids = [before[0][0].token_ids[0]]
    after = engine.generate(PROMPTS, greedy)
    assert after[0][0].token_ids == before[0][0].token_ids[:1] and after[0][0].finished
    for b, a in zip(before[1:], after[1:]):
        stop = next((k + 1 for k, t in enumerate(b[0].token_ids) if t in engine.eos_ids), None)
        assert a[0].token_ids == b[0].token_ids[:stop]


def test_score_is_raw_logprobs(engine):
    seqs, starts = [p + [4, 5, 2] for p in PROMPTS], [len(p) for p in PROMPTS]
    scores = engine.score(seqs, starts)
    with torch.no_grad():
        logp, _ = sequence_logprobs(engine.model, seqs, starts, None, 0)
    assert [len(s) for s in scores] == [3] * len(PROMPTS)
    assert scores == [pytest.approx(row, abs=1e-6) for row in logp.tolist()]


def _plan(named, version, store, push_id, metas=None):
    return PushPlan(
        push_id=push_id,
        version=version,
        store_address=f"127.0.0.1:{store.port}", store_key=store.key,
        world_size=2,
        transport="gloo",
        tensors=metas or tensor_metas(named),
        bucket_bytes=1 << 20,
        timeout_s=30.0,
    )


def _sender(named, plan, store, errors):
    def run():
        try:
            group = make_group(plan, 0, store)
            send_weights(group, named, plan)
            group.close()
        except Exception as err:  # noqa: BLE001 - surfaced by the test
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_in_flight_update_changes_weights_for_later_tokens(engine, tiny_model_dir):
    new_model = load_causal_lm(tiny_model_dir.teacher)
    named = named_weights(new_model)
    store = host_store("127.0.0.1", 0, 30.0)
    plan = _plan(named, 8, store, "inflight")
    engine.eos_ids = [-1]  # never stop early: every sequence runs all steps
    stats, errors = [], []
    real_guard = engine._forward_step
    calls = {"n": 0}

    def guard_that_updates_before_step_3():
        # Runs on the generating thread before it takes the weight lock: the update must complete here
        # (it needs that lock only for the swap), i.e. between two decode steps of a running generate().
        calls["n"] += 1
        if calls["n"] == 3:
            sender = _sender(named, plan, store, errors)
            updater = threading.Thread(target=lambda: stats.append(engine.update_weights(plan, 1)))
            updater.start()
            updater.join(30)
            sender.join(30)
        return real_guard()

    engine._forward_step = guard_that_updates_before_step_3
    gens = _flat(engine.generate(PROMPTS, SamplingParams(max_new_tokens=5), n=1))
    assert not errors and len(stats) == 1
    assert stats[0].version == 8 and stats[0].bytes_received == sum(t.numel() * 4 for _, t in named)
    assert 0 <= stats[0].pause_s <= stats[0].load_s
    for gen in gens:
        assert gen.weight_version == [7, 7, 8, 8, 8]
    assert engine.weight_version == 8
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named_weights(engine.model), named))


def test_bad_plan_fails_clearly_and_leaves_weights_untouched(engine, tiny_model_dir):
    before = [t.clone() for _, t in named_weights(engine.model)]
    named = named_weights(load_causal_lm(tiny_model_dir.teacher))
    name = "model.layers.0.self_attn.k_proj.weight"
    # Same number of elements, wrong shape: the broadcast itself works, the plan does not fit the model.
    named = [(n, t.reshape(t.shape[1], t.shape[0]) if n == name else t) for n, t in named]
    store = host_store("127.0.0.1", 0, 30.0)
    plan = _plan(named, 9, store, "bad-shape")
    errors = []
    sender = _sender(named, plan, store, errors)
    with pytest.raises(ValueError, match=f"{name}.*shape \\(128, 64\\).*model.s is \\(64, 128\\)"):
        engine.update_weights(plan, 1)
    sender.join(30)
    assert not sender.is_alive() and not errors  # the receiver drained the broadcast: nobody hangs
    assert engine.weight_version == 7
    assert all(torch.equal(a, b) for a, (_, b) in zip(before, named_weights(engine.model)))


def test_unknown_tensor_is_rejected(engine):
    store = host_store("127.0.0.1", 0, 30.0)
    metas = tensor_metas(named_weights(engine.model)) + (TensorMeta("extra.weight", (2,), "float32"),)
    named = named_weights(engine.model) + [("extra.weight", torch.zeros(2))]
    plan = _plan(named, 9, store, "unknown", metas)
    sender = _sender(named, plan, store, [])
    with pytest.raises(ValueError, match="'extra.weight'"):
        engine.update_weights(plan, 1)
    sender.join(30)
    assert engine.weight_version == 7


def _push(engine, named, version, bucket_bytes=1 << 20):
    store = host_store("127.0.0.1", 0, 30.0)
    plan = _plan(named, version, store, f"push-{version}")
    plan = PushPlan(**{**plan.__dict__, "bucket_bytes": bucket_bytes})
    errors = []
    sender = _sender(named, plan, store, errors)
    stats = engine.update_weights(plan, 1)
    sender.join(30)
    assert not errors
    return stats


def test_successive_zero_copy_updates_alternate_buffers(engine, tiny_model_dir):
    """Three pushes in small buckets: each lands exactly (the live set is never the one being received
    into), parameters stay the same objects (views move), and the swap is a pointer flip."""
    params_before = [id(p) for p in engine.model.parameters()]
    base = named_weights(load_causal_lm(tiny_model_dir.teacher))
    for version in (8, 9, 10):
        named = [(n, t + 0.01 * version) for n, t in base]
        stats = _push(engine, named, version, bucket_bytes=64 * 1024)
        assert stats.extra["zero_copy"] == 1.0 and engine.weight_version == version
        # It answers with the checksum of what it received: the sender's, as the learner names it at commit.
        assert stats.adapter_checksum == engine.adapter_checksum == weights_checksum(named)
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named_weights(engine.model), named))
        gens = _flat(engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2), n=1))
        assert set(gens[0].weight_version) == {version}
    assert [id(p) for p in engine.model.parameters()] == params_before
    # Tied embeddings (if any) still share one tensor after the rebinds.
    if engine.model.config.tie_word_embeddings:
        assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()


def test_a_push_that_differs_from_what_the_learner_sent_is_never_served(engine, tiny_model_dir):
    """The learner writes the checksum of what it sent into the push's store (where no member may write); a
    receiver compares before its swap. Bytes altered on the way (here: one weight changed after the learner
    hashed) are refused with the live weights untouched; the same push unaltered is served."""
    from asyncrl.core.checks.weights_checksum import WeightsAltered
    from asyncrl.push.broadcast import push_store
    from asyncrl.push.rendezvous import publish_checksum

    before = [t.clone() for _, t in named_weights(engine.model)]
    sent = named_weights(load_causal_lm(tiny_model_dir.teacher))
    altered = [(n, t.clone()) for n, t in sent]
    altered[3][1].view(-1)[0] += 1.0
    for version, on_the_wire in ((9, altered), (10, sent)):
        store = host_store("127.0.0.1", 0, 30.0)
        plan = dataclasses.replace(_plan(sent, version, store, f"checked-{version}"), checksum_in_store=True)

        def send(plan=plan, store=store, on_the_wire=on_the_wire):
            group = make_group(plan, 0, store)
            send_weights(group, on_the_wire, plan)
            publish_checksum(push_store(store, plan), weights_checksum(sent))
            group.close()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        if on_the_wire is altered:
            with pytest.raises(WeightsAltered, match="version 9 arrived with checksum .* not served"):
                engine.update_weights(plan, 1)
            assert engine.weight_version == 7
            assert all(torch.equal(a, b) for a, (_, b) in zip(before, named_weights(engine.model)))
        else:
            assert engine.update_weights(plan, 1).adapter_checksum == weights_checksum(sent)
            assert engine.weight_version == 10
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named_weights(engine.model), sent))
        sender.join(30)


def test_a_manifest_is_checked_once_and_a_different_one_again(engine, tiny_model_dir, monkeypatch):
    """Every push while the membership holds carries the same manifest: it is held against the model once.
    A push with another manifest (a wrong shape) is still checked and refused, and the weights stay."""
    from asyncrl.core.engines import torch_engine

    checked = []
    check = torch_engine.check_weight_metas
    monkeypatch.setattr(torch_engine, "check_weight_metas", lambda model, metas: checked.append(metas) or check(model, metas))
    base = named_weights(load_causal_lm(tiny_model_dir.teacher))
    for version in (8, 9, 10):
        _push(engine, [(n, t + 0.01 * version) for n, t in base], version)
    assert len(checked) == 1 and engine.weight_version == 10
    name = "model.layers.0.self_attn.k_proj.weight"
    bad = [(n, t.reshape(t.shape[1], t.shape[0]) if n == name else t) for n, t in base]
    store = host_store("127.0.0.1", 0, 30.0)
    before = [t.clone() for _, t in named_weights(engine.model)]
    sender = _sender(bad, _plan(bad, 11, store, "bad-shape"), store, [])
    with pytest.raises(ValueError, match=name):
        engine.update_weights(_plan(bad, 11, store, "bad-shape"), 1)
    sender.join(30)
    assert len(checked) == 2 and engine.weight_version == 10
    assert all(torch.equal(a, b) for a, (_, b) in zip(before, named_weights(engine.model)))


def test_a_push_in_another_dtype_is_cast_by_copy(engine, tiny_model_dir):
    named = [(n, t.to(torch.bfloat16)) for n, t in named_weights(load_causal_lm(tiny_model_dir.teacher))]
    stats = _push(engine, named, 8)
    assert stats.extra["zero_copy"] == 0.0 and engine.weight_version == 8
    assert stats.adapter_checksum == weights_checksum(named)  # of the bytes as sent, before the cast
    for (_, got), (_, sent) in zip(named_weights(engine.model), named):
        assert got.dtype == torch.float32 and torch.equal(got, sent.float())


def _count_rows(model, monkeypatch) -> list[int]:
    """The rows of every forward of `model` from now on, in order."""
    widths, forward = [], model.forward

    def counting(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    return widths


def test_a_prompt_sampled_n_times_is_prefilled_once_and_decodes_as_if_it_were_not(tiny_model_dir, monkeypatch):
    """A group's G samples share one prefill (its KV cache copied to each row): same seed, same samples and
    log-probs as prefilling every row, and the prefill forward sees only the distinct prompts."""
    from asyncrl.core.engines import torch_decode

    model = load_causal_lm(tiny_model_dir.policy)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    widths = _count_rows(model, monkeypatch)

    def run():
        widths.clear()
        return _flat(torch_decode.generate_with_model(model, PROMPTS, params, 4, eos_ids=[2], pad_id=0,
                                                      generator=torch.Generator().manual_seed(11)))

    shared, shared_widths = run(), list(widths)
    monkeypatch.setattr(torch_decode, "distinct_prompts", lambda prompts, tags=None: (prompts, list(range(len(prompts)))))
    separate, separate_widths = run(), list(widths)
    monkeypatch.undo()
    widths = _count_rows(model, monkeypatch)
    # A model that cannot share (`prompt_sharing.why_not_shared`, e.g. recurrent layers) prefills every row.
    monkeypatch.setattr(torch_decode, "why_not_shared", lambda _model: "recurrent layers")
    unshared, unshared_widths = run(), list(widths)
    assert unshared_widths[0] == 4 * len(PROMPTS) and [g.token_ids for g in unshared] == [g.token_ids for g in separate]
    assert shared_widths[0] == len(PROMPTS) and separate_widths[0] == 4 * len(PROMPTS)
    assert shared_widths[1] == 4 * len(PROMPTS) and shared_widths[1:] == separate_widths[1:]
    assert [g.token_ids for g in shared] == [g.token_ids for g in separate]
    for a, b in zip(shared, separate):
        assert a.logp_behav == pytest.approx(b.logp_behav, abs=1e-5)


def test_rows_that_finish_leave_the_batch_and_the_others_decode_as_alone(tiny_model_dir, monkeypatch):
    """Once a quarter of a batch's rows are finished the batch drops them (their cache rows go); what every
    row decodes is what it decodes in a batch of its own (seeded rows: batch company changes no draw)."""
    from asyncrl.core.engines import torch_decode

    model = load_causal_lm(tiny_model_dir.policy)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    seeds = [101, 202, 303, 404]
    widths = _count_rows(model, monkeypatch)
    together = torch_decode.generate_with_model(model, PROMPTS, params, 4, eos_ids=[2], pad_id=0, seeds=seeds)
    decode_widths = widths[1:]
    lengths = sorted(len(g.token_ids) for g in _flat(together))
    assert lengths[0] < lengths[-1]  # some rows finish first
    assert decode_widths[0] == 16 and decode_widths[-1] < 16  # ... and the batch goes on without them
    assert decode_widths == sorted(decode_widths, reverse=True)
    for prompt, seed, group in zip(PROMPTS, seeds, together):
        alone = torch_decode.generate_with_model(model, [prompt], params, 4, eos_ids=[2], pad_id=0, seeds=[seed])[0]
        assert [g.token_ids for g in group] == [g.token_ids for g in alone]
        assert [g.finished for g in group] == [g.finished for g in alone]
        for a, b in zip(group, alone):
            assert a.logp_behav == pytest.approx(b.logp_behav, abs=1e-5)
