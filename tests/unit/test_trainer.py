"""Trainer.step on the tiny checkpoint: every objective mode the config offers runs end to end through the
model (logp_prox, logp_ref from the frozen initial policy, the OPD mask, mini-batches) and moves the weights."""

import pytest
import torch

from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
from asyncrl.core.model.modeling import load_causal_lm
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.learner.batch import TrainBatch
from asyncrl.learner.trainer import Trainer


def batch(groups=2, group_size=4, prompt=(1, 5, 6, 14), width=3) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    n = groups * group_size
    responses = torch.randint(3, 12, (n, width), generator=g).tolist()
    lengths = [width - (row % 2) for row in range(n)]
    mask = torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths])
    return TrainBatch(
        entry_ids=[f"{i}-0" for i in range(groups)],
        group_ids=[f"g{row // group_size}" for row in range(n)],
        trajectory_ids=[f"t{row}" for row in range(n)],
        sequences=[list(prompt) + r[:k] for r, k in zip(responses, lengths)],
        response_starts=[len(prompt)] * n,
        logp_behav=-torch.rand(n, width, generator=g) * mask,
        token_versions=torch.zeros(n, width, dtype=torch.long),
        response_mask=mask,
        rewards=torch.tensor([float(row % 3 == 0) for row in range(n)]),
        group_index=torch.tensor([row // group_size for row in range(n)]),
        logp_teacher=-torch.rand(n, width, generator=g) * mask,
    )


ALGOS = {
    "decoupled_ppo": {"preset": "decoupled_token_is"},
    "kl_loss": {"preset": "decoupled_token_is", "kl": {"mode": "loss", "coef": 0.1}},
    "kl_reward": {"preset": "decoupled_token_is", "kl": {"mode": "reward", "coef": 0.1}},
    "opd_loss": {"preset": "decoupled_token_is", "opd": {"enabled": True, "mode": "loss", "pass_rate_threshold": 1.0}},
    "opd_advantage": {"preset": "decoupled_token_is", "opd": {"enabled": True, "mode": "advantage",
                                                              "pass_rate_threshold": 1.0}},
    "bypass_reinforce": {"preset": "bypass_pg_is"},
    "gspo": {"preset": "decoupled_seq_is",
             "policy_loss": {"type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}},
}


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_every_mode_trains_a_step(tiny_model_dir, name):
    model = load_causal_lm(tiny_model_dir.policy)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "minibatches": 2, "algo": ALGOS[name]})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    metrics = trainer.step(batch(), version=3)
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))
    assert metrics["batch/sequences"] == 8
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if name.startswith("kl"):
        # The reference is the frozen initial policy: it did not move with the step.
        assert all(torch.equal(a, p) for a, p in zip(before, trainer.ref_model.parameters()))
        assert any(key.startswith("kl/") for key in metrics), sorted(metrics)
    if name.startswith("opd"):
        assert metrics["opd/token_frac"] > 0


def test_geo_rs_rejects_sequences_whose_behaviour_policy_is_far_off(tiny_model_dir):
    """The batch's logp_behav are random, far from the model's: Geo-RS rejects every sequence, the loss is a
    finite zero and the step leaves the weights alone."""
    model = load_causal_lm(tiny_model_dir.policy)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "algo": {"preset": "decoupled_geo_rs_token_tis"}})
    metrics = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0).step(batch(), 3)
    assert metrics["rc/masked_seq_frac"] == 1.0 and metrics["loss/total"] == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_a_non_finite_update_is_skipped_and_the_weights_stay_finite(tiny_model_dir):
    """A reward that slipped past validation (inf) makes the loss NaN: the update is skipped and counted, the
    weights and the optimizer state are untouched."""
    model = load_causal_lm(tiny_model_dir.policy)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "minibatches": 2, "algo": {"preset": "decoupled_token_is"}})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    poisoned = batch()
    poisoned.rewards[0] = float("inf")  # group 0 -> NaN advantages -> NaN loss in its mini-batch
    metrics = trainer.step(poisoned, version=3)
    assert metrics["opt/skipped_updates"] >= 1
    assert trainer.weights_finite()
    if metrics["opt/skipped_updates"] == 2:
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not trainer.optimizer.state or all(
        torch.isfinite(v).all() for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v))


@pytest.mark.parametrize("value, finite", [(float("nan"), False), (float("inf"), False), (-float("inf"), False),
                                          (3e38, True)])
def test_the_weights_check_finds_any_non_finite_weight(tiny_model_dir, value, finite):
    """One bad value in one tensor is found; huge finite weights (whose norm overflows) still pass."""
    model = load_causal_lm(tiny_model_dir.policy)
    trainer = Trainer(model, LearnerConfig(), SamplingParams.from_config(SamplingConfig()), pad_id=0)
    assert trainer.weights_finite()
    with torch.no_grad():
        list(model.parameters())[-1].view(-1)[3] = value
    assert trainer.weights_finite() is finite


def test_a_batch_without_teacher_log_probs_trains_without_the_distillation_term(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "algo": ALGOS["opd_advantage"]})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    unannotated = batch()
    unannotated.logp_teacher = None
    metrics = trainer.step(unannotated, version=3)
    assert metrics["teacher/unavailable"] == 1.0 and "opd/token_frac" not in metrics
    assert trainer.step(batch(), version=4)["teacher/unavailable"] == 0.0


@pytest.mark.parametrize("name", ["decoupled_ppo", "opd_advantage", "kl_loss"])
def test_one_minibatch_reuses_the_training_forward_as_the_proximal_one(tiny_model_dir, name):
    """With one mini-batch trained whole, the proximal policy is the policy before the step's only update:
    the fused step (no separate no-grad forward) gives the same loss, metrics and weights as the step with it."""
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "minibatches": 1, "algo": ALGOS[name]})
    results = []
    for fused in (True, False):
        torch.manual_seed(0)
        model = load_causal_lm(tiny_model_dir.policy)
        trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
        assert trainer.fuses_proximal
        trainer.fuses_proximal = fused
        forwards, policy_forward = [], trainer._logprobs
        trainer._logprobs = lambda b, m=None, seen=forwards, run=policy_forward: seen.append(m) or run(b, m)
        metrics = trainer.step(batch(), version=3)
        assert sum(m is None for m in forwards) == (1 if fused else 2)  # the policy's forwards of the batch
        results.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (fused_metrics, fused_weights), (plain_metrics, plain_weights) = results
    for key in ("loss/total", "opt/grad_norm", "rc/kl_k3", "adv/mean"):
        if key in plain_metrics:
            assert fused_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-4, abs=1e-6), key
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fused_weights, plain_weights))


def test_the_proximal_forward_is_fused_only_where_it_is_exact(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    sampling = SamplingParams.from_config(SamplingConfig())

    def fuses(**fields) -> bool:
        cfg = LearnerConfig.model_validate({"minibatches": 1, "algo": ALGOS["decoupled_ppo"], **fields})
        return Trainer(model, cfg, sampling, pad_id=0).fuses_proximal

    assert fuses()
    assert not fuses(minibatches=2)  # the second mini-batch's proximal policy is not its current one
    assert not fuses(microbatch_tokens=64)  # parts need the whole mini-batch's denominators first
    assert not fuses(algo={"preset": "decoupled_token_is", "advantage": {"dash_threshold": 0.1}})
    assert not fuses(algo={"preset": "bypass_ppo_clip"})  # no proximal forward to save


@pytest.mark.parametrize("reward", [0.0, 1.0])
@pytest.mark.parametrize("rows_without_gradient", ["forwarded without it", "not forwarded"])
def test_rows_without_gradient_change_nothing_the_step_trains(tiny_model_dir, reward, rows_without_gradient):
    """A group whose rewards are all equal has zero advantage: the fused forward runs it without gradient, or
    (`skips_rows`: nothing rejects or rescales over the batch) not at all, and the step's gradients, loss and
    advantages are those of one forward of the whole batch with gradient. Forwarded, every diagnostic is too;
    not forwarded, the diagnostics are over the rows that carry a gradient."""
    b = batch(groups=3)
    b.rewards[4:8] = reward  # the second group: every sample right, or every one wrong
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "minibatches": 1, "algo": ALGOS["decoupled_ppo"]})
    skip = rows_without_gradient == "not forwarded"
    results = []
    for split in (True, False):
        model = load_causal_lm(tiny_model_dir.policy)
        trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
        assert trainer.splits_rows and trainer.skips_rows
        trainer.splits_rows, trainer.skips_rows = split, split and skip
        grads, update = [], trainer.optimizer.step
        trainer.optimizer.step = lambda grads=grads, model=model, update=update: (
            grads.extend(p.grad.clone() for p in model.parameters()) or update())
        forwarded, policy_forward = [], trainer._logprobs
        trainer._logprobs = lambda mb, m=None, seen=forwarded, run=policy_forward: seen.append(len(mb)) or run(mb, m)
        metrics = trainer.step(b, version=3)
        results.append((metrics, grads, forwarded))
    (split_metrics, split_grads, split_rows), (plain_metrics, plain_grads, plain_rows) = results
    assert (split_metrics["batch/gradient_free_sequences"], plain_metrics["batch/gradient_free_sequences"]) == (4, 0)
    assert plain_rows == [12] and split_rows == ([8] if skip else [8, 4])
    same = ("loss/total", "opt/grad_norm", "adv/mean", "reward/mean") if skip else plain_metrics
    for key in same:
        value = plain_metrics[key]
        if not key.startswith(("time/", "batch/gradient_free")) and isinstance(value, float):
            assert split_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # The gradients, not the weights: AdamW's first update divides by |g|, so rounding in a tiny gradient
    # moves its weight by up to lr.
    assert split_grads and all(torch.allclose(a, b, rtol=1e-4, atol=1e-8) for a, b in zip(split_grads, plain_grads))


def test_rows_without_gradient_are_left_out_only_where_nothing_rejects_or_rescales(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    sampling = SamplingParams.from_config(SamplingConfig())

    def skips(algo: dict) -> bool:
        cfg = LearnerConfig.model_validate({"minibatches": 1, "algo": algo})
        return Trainer(model, cfg, sampling, pad_id=0).skips_rows

    assert skips({"preset": "decoupled_token_is"}) and skips({"preset": "decoupled_seq_is"})
    for preset in ("decoupled_geo_rs", "decoupled_seq_is_rs", "decoupled_k3_rs"):  # a row's ratio rejects it
        assert not skips({"preset": preset}), preset
    assert not skips({"preset": "decoupled_token_is", "rollout_correction": {"veto_threshold": 1e-4}})
    assert not skips({"preset": "decoupled_token_is", "rollout_correction": {"batch_normalize": True}})
    assert not skips(ALGOS["kl_loss"])  # no split at all


def test_rows_are_split_only_where_a_rows_gradient_is_known_from_its_advantage(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    sampling = SamplingParams.from_config(SamplingConfig())

    def splits(name: str, **fields) -> bool:
        cfg = LearnerConfig.model_validate({"minibatches": 1, "algo": ALGOS[name], **fields})
        return Trainer(model, cfg, sampling, pad_id=0).splits_rows

    assert splits("decoupled_ppo") and splits("gspo")
    for name in ("kl_loss", "kl_reward", "opd_loss", "opd_advantage"):  # a term beside the advantage's
        assert not splits(name), name
    assert not splits("decoupled_ppo", minibatches=2)  # no fused forward to split


def two_prompt_batch() -> TrainBatch:
    """`batch()` with the second group's prompt longer and different: prompts of two lengths (left padding)."""
    b = batch()
    other = [1, 9, 14, 9, 8, 15]
    for row in range(len(b)):
        if int(b.group_index[row]) == 1:
            b.sequences[row] = other + b.sequences[row][b.response_starts[row]:]
            b.response_starts[row] = len(other)
    return b


@pytest.mark.parametrize("fields", [{"minibatches": 1}, {"minibatches": 2}, {"microbatch_tokens": 24},
                                    {"algo": ALGOS["kl_loss"]}])
def test_sharing_prompts_trains_as_whole_sequences_do(tiny_model_dir, fields):
    """`learner.share_prompts`: each group's prompt forwards once, so far fewer tokens go through the model,
    and two steps give the weights and metrics of forwarding every sequence whole."""
    cfg = {"lr": 1e-3, "algo": ALGOS["decoupled_ppo"], **fields}
    results = []
    for share in (True, False):
        model = load_causal_lm(tiny_model_dir.policy)
        trainer = Trainer(model, LearnerConfig.model_validate({**cfg, "share_prompts": share}),
                          SamplingParams.from_config(SamplingConfig()), pad_id=0)
        assert trainer.shares_prompts is share
        tokens: list[int] = []

        def counting(*a, forward=model.base_model.forward, seen=tokens, **k):
            seen.append(k["input_ids"].numel())
            return forward(*a, **k)

        model.base_model.forward = counting
        metrics = [trainer.step(two_prompt_batch(), version=v) for v in (3, 4)]
        results.append((metrics, [p.detach().clone() for p in model.parameters()], sum(tokens)))
    (shared_metrics, shared_weights, shared_tokens), (whole_metrics, whole_weights, whole_tokens) = results
    assert shared_tokens < 0.8 * whole_tokens
    for shared, whole in zip(shared_metrics, whole_metrics):
        for key in ("loss/total", "opt/grad_norm", "adv/mean", "kl/loss"):
            if key in whole:
                assert shared[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    # Float rounding differs between the two forwards; AdamW divides each gradient by its own scale, so a
    # weight whose gradient is nearly zero moves by a rounding-sized gradient as much as by lr = 1e-3 per step.
    # Measured: at most 1e-5 after the two steps; a wrong gradient moves weights by the step size.
    diffs = [(a - b).abs().max().item() for a, b in zip(shared_weights, whole_weights)]
    assert max(diffs) < 5e-5, diffs


def test_prompts_are_shared_only_for_a_dense_policy_on_one_rank(tiny_model_dir):
    from tests.unit.test_routing import tiny_moe

    sampling = SamplingParams.from_config(SamplingConfig())
    assert Trainer(load_causal_lm(tiny_model_dir.policy), LearnerConfig(), sampling, pad_id=0).shares_prompts
    # An MoE policy's routing is captured per sequence position (replayed, or compared with the rollout's).
    assert not Trainer(tiny_moe(layers=2), LearnerConfig(), sampling, pad_id=0).shares_prompts
    checkpointed = load_causal_lm(tiny_model_dir.policy)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Checkpointing drops the KV cache, but packed rows need none; without them either, every sequence whole.
    assert Trainer(checkpointed, LearnerConfig(), sampling, pad_id=0).shares_prompts
    checkpointed.config._attn_implementation = "flash_attention_2"
    assert not Trainer(checkpointed, LearnerConfig(), sampling, pad_id=0).shares_prompts


@pytest.mark.parametrize("minibatches", [1, 2])
def test_an_episode_batch_trains_only_the_model_tokens(tiny_model_dir, minibatches):
    """Observations inside and at the end of responses (mask 0) neither train nor break the widths: a step over
    a batch whose widest rows end with an observation (the fused proximal forward, and mini-batches)."""
    b = batch(width=6)
    b.response_mask[:, 4:] = 0.0  # every response ends with a 2-token observation
    b.response_mask[::2, 1:3] = 0.0  # and half of them hold one mid-response
    b.logp_behav = b.logp_behav * b.response_mask
    model = load_causal_lm(tiny_model_dir.policy)
    cfg = LearnerConfig.model_validate({"lr": 1e-3, "minibatches": minibatches, "algo": {"preset": "decoupled_token_is"}})
    trainer = Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0)
    assert trainer.fuses_proximal == (minibatches == 1)
    metrics = trainer.step(b, version=3)
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))
    assert metrics["batch/response_tokens"] == int(b.response_mask.sum().item())
