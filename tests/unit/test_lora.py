"""LoRA's pure parts, against hand-computed values: the adapter's wire form and its checks (naming the field),
the checks of an adapter push against a model, the merge, the checksum, the versions a vLLM engine keeps
loaded, the controller's verdict on a receiver that serves another adapter; and the learner's side on the tiny
checkpoint (peft injection, the base as KL reference, a step moves the adapters only, the merged export)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.validation import InvalidArgument
from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.config.schema import AsyncRLConfig, LearnerConfig, SamplingConfig
from asyncrl.core.lora.merge import merged_weight
from asyncrl.core.lora.spec import AdapterSpec, match_adapter, parse_adapter_name
from asyncrl.core.lora.versions import AdapterServing, AdapterVersions, Served
from asyncrl.core.model.modeling import load_causal_lm
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.manifest import manifest_bytes, parse_manifest
from asyncrl.push.plan import PushPlan
from asyncrl.push.session import Outcome, judge_adapter
from asyncrl.v1 import weights_pb2
from tests.conftest import TEST_STORE_KEY

SPEC = AdapterSpec(4, 8.0, ("q_proj", "v_proj"))
SHAPES = {"model.layers.0.self_attn.q_proj.weight": (16, 12), "model.layers.0.self_attn.v_proj.weight": (8, 12),
          "model.layers.0.self_attn.k_proj.weight": (8, 12), "model.embed_tokens.weight": (50, 12)}


def meta(module: str, part: str, shape) -> TensorMeta:
    return TensorMeta(f"base_model.model.{module}.lora_{part}.weight", tuple(shape), "float32")


def good_metas() -> list[TensorMeta]:
    q, v = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"
    return [meta(q, "A", (4, 12)), meta(q, "B", (16, 4)), meta(v, "A", (4, 12)), meta(v, "B", (8, 4))]


def test_spec_round_trips_and_scales():
    assert AdapterSpec.from_proto(SPEC.to_proto(), "adapter") == SPEC
    assert SPEC.scale == 2.0
    assert AdapterSpec.from_proto(weights_pb2.AdapterSpec(), "adapter") is None  # unset: full weights


@pytest.mark.parametrize(("msg", "field"), [
    (weights_pb2.AdapterSpec(rank=0, alpha=8, target_modules=["q_proj"]), "plan.adapter.rank"),
    (weights_pb2.AdapterSpec(rank=5000, alpha=8, target_modules=["q_proj"]), "plan.adapter.rank"),
    (weights_pb2.AdapterSpec(rank=4, alpha=float("nan"), target_modules=["q_proj"]), "plan.adapter.alpha"),
    (weights_pb2.AdapterSpec(rank=4, alpha=8), "plan.adapter.target_modules"),
    (weights_pb2.AdapterSpec(rank=4, alpha=8, target_modules=["q proj"]), "plan.adapter.target_modules[0]"),
    (weights_pb2.AdapterSpec(rank=4, alpha=8, target_modules=["lm_head"]), "plan.adapter.target_modules[0]"),
])
def test_a_bad_spec_is_refused_naming_the_field(msg, field):
    with pytest.raises(InvalidArgument) as err:
        AdapterSpec.from_proto(msg, "plan.adapter")
    assert err.value.field == field


def test_a_plan_carries_its_adapter_and_a_manifest_plan_may_not_name_one():
    plan = PushPlan(push_id="p1", version=3, store_address="127.0.0.1:5", store_key=TEST_STORE_KEY, world_size=2, transport="gloo",
                    tensors=tuple(good_metas()), bucket_bytes=1 << 20, timeout_s=5.0, adapter=SPEC)
    assert PushPlan.from_proto(plan.to_proto()).adapter == SPEC
    msg = plan.to_proto()
    msg.manifest_digest, msg.group_id = "a" * 64, "g1"
    del msg.tensors[:]
    with pytest.raises(InvalidArgument) as err:
        PushPlan.from_proto(msg)
    assert err.value.field == "plan.adapter"


def test_the_manifest_names_the_adapter():
    data, digest = manifest_bytes(good_metas(), SPEC)
    assert parse_manifest(data, digest) == (tuple(good_metas()), SPEC)
    data, digest = manifest_bytes(good_metas())
    assert parse_manifest(data, digest)[1] is None


def test_adapter_names_parse_as_peft_saves_them():
    assert parse_adapter_name("base_model.model.model.layers.3.mlp.up_proj.lora_B.weight") == (
        "model.layers.3.mlp.up_proj", "B")
    with pytest.raises(ValueError, match="not named as peft saves"):
        parse_adapter_name("model.layers.3.mlp.up_proj.weight")


def test_a_fitting_adapter_matches_module_by_module():
    layers = match_adapter(good_metas(), SPEC, SHAPES)
    assert [(x.module, x.weight_name) for x in layers] == [
        ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj.weight"),
        ("model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.v_proj.weight")]


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m[:3], "has lora_A but no lora_B"),
    (lambda m: [dataclasses.replace(m[0], shape=(4, 11))] + m[1:], r"has shape \(4, 11\), rank 4 on 'model.layers.0.self_attn.q_proj' needs \(4, 12\)"),
    (lambda m: m + [meta("model.layers.0.self_attn.k_proj", "A", (4, 12))], "not among the adapter's target_modules"),
    (lambda m: m + [meta("model.layers.9.self_attn.q_proj", "A", (4, 12))], "has no linear module"),
    (lambda m: m + m[:1], "listed twice"),
    (lambda m: [], "carries no adapter tensors"),
])
def test_an_adapter_that_does_not_fit_is_refused_naming_the_tensor(change, message):
    with pytest.raises(ValueError, match=message):
        match_adapter(change(good_metas()), SPEC, SHAPES)


def test_the_merge_is_base_plus_scaled_b_times_a():
    base = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a, b = torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0], [-1.0]])  # rank 1: B A = [[2, 0], [-1, 0]]
    assert torch.equal(merged_weight(base, a, b, 0.5), torch.tensor([[2.0, 2.0], [2.5, 4.0]]))
    assert torch.equal(base, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # the base is left as it was


def test_the_checksum_covers_names_shapes_and_bytes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    one = weights_checksum([("x", t)])
    assert one == weights_checksum([("x", t.clone())]) and len(one) == 64
    assert one != weights_checksum([("y", t)])
    assert one != weights_checksum([("x", t.reshape(3, 2))])
    bumped = t.clone()
    bumped[1, 2] = torch.nextafter(bumped[1, 2], torch.tensor(100.0))
    assert one != weights_checksum([("x", bumped)])


def served(v: int) -> Served:
    return Served(v, f"/adapters/v{v}", f"sum{v}")


def test_the_newest_versions_stay_loaded_and_a_batch_keeps_its_own():
    book = AdapterVersions(keep=2)  # eta 0 -> 2 kept
    assert book.acquire() is None  # before any adapter: the base
    assert book.added(served(1)) == [] and book.added(served(2)) == []
    running = book.acquire()
    assert running.version == 2
    assert [s.version for s in book.added(served(3))] == [1]  # not among the 2 newest, nobody runs on it
    assert book.added(served(4)) == []  # 2 is older than the 2 newest but a batch still runs on it
    assert book.loaded == [2, 3, 4]
    assert [s.version for s in book.release(running)] == [2]
    assert book.loaded == [3, 4] and book.newest == served(4)
    with pytest.raises(ValueError, match="not newer"):
        book.added(served(4))


def test_a_run_keeps_eta_plus_two_adapter_versions_and_rounds_the_rank_up_for_vllm():
    lora = SimpleNamespace(enabled=True, rank=12)
    assert AdapterServing.for_run(lora, 2) == AdapterServing(12, 4)
    assert AdapterServing.for_run(lora, None).versions_kept == 4
    assert AdapterServing.for_run(SimpleNamespace(enabled=False, rank=12), 2) is None
    assert AdapterServing(12, 4).vllm_rank == 16 and AdapterServing(8, 4).vllm_rank == 8
    with pytest.raises(ValueError, match="up to rank 512"):
        _ = AdapterServing(600, 4).vllm_rank


@pytest.mark.parametrize(("outcome", "ok", "error"), [
    (Outcome(True, "", 0.1, adapter_checksum="c" * 64), True, ""),
    (Outcome(True, "", 0.1, adapter_checksum="d" * 64), False, "serves weights checksum dddddddddddd"),
    (Outcome(True, "", 0.1), False, "serves weights checksum none"),
    (Outcome(False, "boom", 0.1), False, "boom"),
])
def test_a_receiver_that_serves_another_adapter_failed_the_push(outcome, ok, error):
    judged = judge_adapter(outcome, "c" * 64)
    assert judged.ok == ok and judged.error.startswith(error)
    assert judge_adapter(outcome, "") == outcome  # a commit that names no checksum: nothing to compare


def test_config_refuses_untargetable_modules_naming_the_key():
    with pytest.raises(ValueError, match="learner.lora.target_modules: 'lm_head'"):
        AsyncRLConfig.model_validate({"learner": {"lora": {"target_modules": ["lm_head"]}}})
    with pytest.raises(ValueError, match="learner.lora.target_modules: name at least one"):
        AsyncRLConfig.model_validate({"learner": {"lora": {"target_modules": []}}})


# ---- the learner's side, on the tiny checkpoint -----------------------------------------------------------


def lora_cfg(**kw):
    return SimpleNamespace(**{"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], **kw})


def test_injection_freezes_the_base_and_names_the_adapters_as_peft_saves_them(tiny_model_dir):
    from asyncrl.core.checks.config_error import ConfigError
    from asyncrl.learner.adapters import inject_adapters, lora_parameters

    model = load_causal_lm(tiny_model_dir.policy)
    layers = model.config.num_hidden_layers
    spec = inject_adapters(model, lora_cfg())
    named = lora_parameters(model)
    assert spec == SPEC and len(named) == 4 * layers
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n.replace("base_model.model.", "").replace(".weight", ".default.weight") for n, _ in named}
    with pytest.raises(ConfigError, match="learner.lora.target_modules: no module of the model is named 'qkv'"):
        inject_adapters(load_causal_lm(tiny_model_dir.policy), lora_cfg(target_modules=["qkv"]))
    with pytest.raises(ConfigError, match="'input_layernorm' matches model.layers.0.input_layernorm, a Qwen2RMSNorm"):
        inject_adapters(load_causal_lm(tiny_model_dir.policy), lora_cfg(target_modules=["input_layernorm"]))


def test_a_lora_step_trains_the_adapters_only_with_the_base_as_kl_reference(tiny_model_dir):
    from asyncrl.learner.adapters import adapters_disabled, inject_adapters, lora_parameters
    from asyncrl.learner.trainer import Trainer
    from tests.unit.test_trainer import batch

    model = load_causal_lm(tiny_model_dir.policy)
    reference = load_causal_lm(tiny_model_dir.policy)
    inject_adapters(model, lora_cfg())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    cfg = LearnerConfig.model_validate({"lr": 1e-2, "lora": {"enabled": True, "rank": 4, "alpha": 8.0,
                                                            "target_modules": ["q_proj", "v_proj"]},
                                        "algo": {"preset": "decoupled_token_is", "kl": {"mode": "loss", "coef": 0.1}}})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    assert trainer.ref_model is None  # no copy: the base with its adapters off
    assert {id(p) for group in trainer.optimizer.param_groups for p in group["params"]} == {
        id(p) for _, p in lora_parameters(model)}
    for _ in range(2):  # B starts at 0: the first step moves B, the second A too
        trainer.step(batch(), version=3)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert all(p.abs().sum() > 0 for n, p in lora_parameters(model) if ".lora_B." in n)
    seqs, starts = [[1, 5, 6, 14, 3, 4]], [4]
    from asyncrl.core.model.modeling import sequence_logprobs

    with torch.no_grad(), adapters_disabled(model):
        base_logp, _ = sequence_logprobs(model.eval(), seqs, starts, None, pad_id=0)
    with torch.no_grad():
        ref_logp, _ = sequence_logprobs(reference.eval(), seqs, starts, None, pad_id=0)
        trained_logp, _ = sequence_logprobs(model, seqs, starts, None, pad_id=0)
    assert torch.allclose(base_logp, ref_logp, atol=1e-6)
    assert not torch.allclose(trained_logp, ref_logp, atol=1e-4)


def test_the_merged_export_computes_what_the_adapted_policy_computes(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from asyncrl.learner.adapters import inject_adapters, lora_parameters, merged_state_dict, save_adapter

    model = load_causal_lm(tiny_model_dir.policy)
    spec = inject_adapters(model, lora_cfg())
    torch.manual_seed(0)
    for _, p in lora_parameters(model):
        torch.nn.init.normal_(p, std=0.05)
    model.save_pretrained(str(tmp_path / "hf"), state_dict=merged_state_dict(model, spec))
    checksum = save_adapter(tmp_path / "adapter", spec, lora_parameters(model), str(tiny_model_dir.policy))
    assert (tmp_path / "adapter" / "checksum.txt").read_text().strip() == checksum
    ids = torch.tensor([[1, 5, 6, 14, 3, 4]])
    with torch.no_grad():
        want = model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()(ids).logits
    assert torch.allclose(merged, want, atol=1e-5)
    # peft itself reads the adapter directory onto the base.
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(load_causal_lm(tiny_model_dir.policy), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, want, atol=1e-5)


def test_runs_on_one_base_each_train_as_if_alone(tiny_model_dir):
    """Two runs' adapters (other ranks, targets and learning rates) on one base, their steps interleaved: each
    run's adapter ends bit for bit where the same run trained alone on its own copy of the base ends, its
    gradients clipped by their own norm (the other run's, still set from its last step, not counted); the base
    never moves; each run's optimizer holds its own adapter only."""
    from asyncrl.learner.adapters import inject_adapters, lora_parameters, run_active
    from asyncrl.learner.trainer import Trainer
    from tests.unit.test_trainer import batch

    runs = {"sums": (lora_cfg(), 1e-2, (1, 5, 6, 14)),
            "words": (lora_cfg(rank=8, target_modules=["q_proj", "k_proj", "o_proj"]), 5e-3, (1, 7, 8, 9))}
    sampling = SamplingParams.from_config(SamplingConfig())

    def trainer(model, run):
        lora, lr, _ = runs[run]
        cfg = LearnerConfig.model_validate({"lr": lr, "lora": {"enabled": True, **vars(lora)}, "max_grad_norm": 0.01,
                                            "algo": {"preset": "decoupled_token_is",
                                                     "kl": {"mode": "loss", "coef": 0.1}}})
        with run_active(model, run):
            return Trainer(model, cfg, sampling, pad_id=0)

    shared = load_causal_lm(tiny_model_dir.policy)
    frozen = {n: p.detach().clone() for n, p in shared.named_parameters()}
    trainers = {}
    for seed, run in enumerate(runs):
        torch.manual_seed(seed)  # peft draws A at random
        inject_adapters(shared, runs[run][0], run)
        trainers[run] = trainer(shared, run)
    for run, t in trainers.items():
        assert {id(p) for g in t.optimizer.param_groups for p in g["params"]} == {
            id(p) for _, p in lora_parameters(shared, run)}
    norms = {run: [] for run in runs}
    for step in range(3):
        for run, t in trainers.items():
            with run_active(shared, run):
                norms[run].append(t.step(batch(prompt=runs[run][2]), version=step + 1)["opt/grad_norm"])
    assert all(torch.equal(p, frozen[n]) for n, p in shared.named_parameters() if n in frozen)

    ids = torch.tensor([[1, 5, 6, 14, 3, 4]])
    outputs = {}
    for seed, run in enumerate(runs):
        alone = load_causal_lm(tiny_model_dir.policy)
        torch.manual_seed(seed)
        inject_adapters(alone, runs[run][0], run)
        t = trainer(alone, run)
        alone_norms = [t.step(batch(prompt=runs[run][2]), version=step + 1)["opt/grad_norm"] for step in range(3)]
        assert norms[run] == alone_norms and min(alone_norms) > 0.01  # every step clipped, by its own norm
        for (name, got), (_, want) in zip(lora_parameters(shared, run), lora_parameters(alone, run), strict=True):
            assert torch.equal(got, want), (run, name)
        with torch.no_grad(), run_active(shared, run):
            outputs[run] = shared.eval()(ids).logits
            assert torch.equal(outputs[run], alone.eval()(ids).logits)
    assert not torch.allclose(outputs["sums"], outputs["words"], atol=1e-4)
    with pytest.raises(ValueError, match="no adapter named 'x'"), run_active(shared, "x"):
        pass
    with pytest.raises(ValueError, match="already holds an adapter named 'sums'"):
        inject_adapters(shared, runs["sums"][0], "sums")
