"""Forwards with shared prompts (`asyncrl.core.model.prompt_sharing`): each distinct prompt runs once, in either
layout (KV copy, packed rows) and in the one chosen by cost, and the log-probs, and with grad the gradients,
equal the one-forward `sequence_logprobs` to float rounding."""

import pytest
import torch

from asyncrl.core.config.schema import SamplingConfig
from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.packing import packed_logprobs, why_not_packed
from asyncrl.core.model.prompt_sharing import (
    choose_layout,
    kv_copy_logprobs,
    shared_head,
    shared_prompt_logprobs,
    why_not_shared,
)
from asyncrl.core.model.sampling import SamplingParams

# Prompts of different lengths (left padding), responses of different lengths (right padding).
PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 12, 13, 14, 4, 15]]


LAYOUTS = {"kv copy": kv_copy_logprobs, "packed": packed_logprobs, "chosen": shared_prompt_logprobs}


def groups(samples: int):
    sequences, starts = [], []
    for j, prompt in enumerate(PROMPTS):
        for k in range(samples):
            sequences.append(prompt + [3 + (k + j) % 10] * (1 + k % 4) + [2])
            starts.append(len(prompt))
    return sequences, starts


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("samples", [1, 4])
def test_shared_prompts_score_as_one_forward_does(tiny_model_dir, samples, layout):
    model = load_causal_lm(tiny_model_dir.teacher)
    sequences, starts = groups(samples)
    with torch.no_grad():
        expected, expected_mask = sequence_logprobs(model, sequences, starts, None, pad_id=0)
    with torch.no_grad():
        logp, mask = LAYOUTS[layout](model, sequences, starts, pad_id=0)
    assert torch.equal(mask, expected_mask)
    assert torch.allclose(logp, expected, atol=2e-5)
    assert (logp[~mask] == 0).all()


def test_each_distinct_prompt_runs_once(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.teacher)
    shapes = _forwards(model)
    sequences, starts = groups(4)
    kv_copy_logprobs(model, sequences, starts, pad_id=0)
    longest_prompt, longest_response = max(map(len, PROMPTS)), max(len(s) - b for s, b in zip(sequences, starts))
    assert shapes == [(len(PROMPTS), longest_prompt), (len(sequences), longest_response)]
    # Packed: one row (the tiny model's rows hold 6 x 64 positions) of each prompt once and every response
    # but its last token.
    shapes.clear()
    packed_logprobs(model, sequences, starts, pad_id=0)
    assert shapes == [(1, sum(map(len, PROMPTS)) + sum(len(s) - b - 1 for s, b in zip(sequences, starts)))]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("start", [0, -2, 99])
def test_a_response_start_outside_the_sequence_is_refused(tiny_model_dir, start, layout):
    model = load_causal_lm(tiny_model_dir.teacher)
    sequences, starts = groups(2)
    starts[1] = start
    with pytest.raises(ValueError, match="response_start"):
        LAYOUTS[layout](model, sequences, starts, pad_id=0)


def _loss_and_grads(model, forward, sequences, starts, params):
    model.zero_grad(set_to_none=True)
    logp, mask = forward(model, sequences, starts, params, 0)
    # Weighted per token, so that every log-prob's gradient counts with its own factor.
    weights = torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)
    (logp * weights * mask).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 6}])
def test_gradients_through_shared_prompts_equal_the_one_forward_gradients(tiny_model_dir, sampling, layout):
    """What the learner trains through: each row's gradient flows back into its prompt's one forward."""
    model = load_causal_lm(tiny_model_dir.policy).train()
    params = SamplingParams.from_config(SamplingConfig(**sampling))
    sequences, starts = groups(4)
    expected, expected_grads = _loss_and_grads(model, sequence_logprobs, sequences, starts, params)
    logp, grads = _loss_and_grads(model, LAYOUTS[layout], sequences, starts, params)
    assert torch.allclose(logp, expected, atol=2e-5)
    for name, grad, want in zip((n for n, _ in model.named_parameters()), grads, expected_grads):
        assert torch.allclose(grad, want, rtol=1e-4, atol=1e-5), name
    assert any(g.abs().sum() > 0 for g in grads)


def _forwards(model) -> list[tuple[int, int]]:
    """Records the input shape of every base-model forward of `model`."""
    shapes, forward = [], model.base_model.forward

    def counting(*args, **kwargs):
        shapes.append(tuple((args[0] if args else kwargs["input_ids"]).shape))
        return forward(*args, **kwargs)

    model.base_model.forward = counting
    return shapes


def test_a_model_sharded_at_its_root_runs_each_sequence_whole(tiny_model_dir):
    """FSDP2's root brackets one forward per call in its hooks: no second forward there."""
    model = load_causal_lm(tiny_model_dir.teacher)
    calls = []
    model.run_in_root_forward = lambda fn, *args, **kwargs: calls.append(args) or fn(model, *args, **kwargs)
    sequences, starts = groups(4)
    with torch.no_grad():
        logp, _ = shared_prompt_logprobs(model, sequences, starts, pad_id=0)
    assert len(calls) == 1 and logp.shape[0] == len(sequences)
    assert "FSDP2" in why_not_shared(model)


def test_a_checkpointing_model_packs_its_rows_in_one_forward(tiny_model_dir):
    """Activation checkpointing makes a Hugging Face model drop its KV cache, so a prefill would be wasted:
    packed rows (no cache needed) in one forward, the same values."""
    model = load_causal_lm(tiny_model_dir.policy).train()
    sequences, starts = groups(4)
    with torch.no_grad():
        expected, _ = sequence_logprobs(model, sequences, starts, None, pad_id=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert "checkpointing" in why_not_shared(model)
    shapes = _forwards(model)
    assert choose_layout(model, sequences, starts) == "packed"
    logp, _ = shared_prompt_logprobs(model, sequences, starts, pad_id=0)
    assert len(shapes) == 1 and shapes[0][0] == 1
    assert torch.allclose(logp.detach(), expected, atol=2e-5)
    model.config._attn_implementation = "flash_attention_2"  # neither layout: every sequence whole
    shapes.clear()
    assert choose_layout(model, sequences, starts) == "whole"


@pytest.mark.parametrize("layer_types, shares", [
    (["full_attention", "sliding_attention"], True),
    (["full_attention", "linear_attention"], False),  # Qwen3-Next / Qwen3.5 style: a recurrent state
    (["mamba", "attention"], False),
])
def test_only_attention_only_models_share(tiny_model_dir, layer_types, shares):
    """A recurrent layer's state would run through the left padding of a shorter prompt."""
    model = load_causal_lm(tiny_model_dir.policy)
    model.config.layer_types = layer_types
    assert (why_not_shared(model) is None) is shares


def test_an_attention_only_model_shares(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    assert model.config.layer_types == ["full_attention"] * model.config.num_hidden_layers
    assert why_not_shared(model) is None


ARCHITECTURES = {
    "llama": ("LlamaConfig", {}),
    "mistral, sliding window 4": ("MistralConfig", {"sliding_window": 4}),
    "gemma2 (soft-capping, sliding layers)": ("Gemma2Config", {"head_dim": 32, "sliding_window": 4}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "gpt2 (absolute positions)": ("GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128,
                                                 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
}


PACKABLE = {"llama", "qwen3", "gpt2 (absolute positions)"}
"""The others have sliding windows, which a packed row's full-attention mask would not apply."""


def _architecture(name: str):
    """A tiny random model of `name` (ARCHITECTURES), dropout off as in RL training."""
    import transformers

    cls, fields = ARCHITECTURES[name]
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 128} if cls != "GPT2Config" else {}
    config = getattr(transformers, cls)(vocab_size=32, **shape, **fields)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).float()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_other_architectures_share_exactly(name, layout):
    """A user's model is not the demo's Qwen2: other position schemes, sliding windows and logit soft-capping
    give the one-forward log-probs and gradients too (tiny random models, dropout off as in RL training)."""
    model = _architecture(name).train()
    assert why_not_shared(model) is None
    assert (why_not_packed(model) is None) is (name in PACKABLE), why_not_packed(model)
    if layout == "packed" and name not in PACKABLE:
        pytest.skip(f"{name}: {why_not_packed(model)}")
    sequences, starts = groups(4)
    expected, expected_grads = _loss_and_grads(model, sequence_logprobs, sequences, starts, None)
    logp, grads = _loss_and_grads(model, LAYOUTS[layout], sequences, starts, None)
    assert torch.allclose(logp, expected, atol=2e-5)
    for grad, want in zip(grads, expected_grads):
        assert torch.allclose(grad, want, rtol=1e-4, atol=1e-5)


HEAD = [1] + [3 + i % 12 for i in range(17)]
"""18 tokens every prompt of `test_a_shared_head...` starts with (a chat template's system turn)."""


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_a_shared_head_is_prefilled_once_and_each_prompt_decodes_as_alone(name):
    """Prompts that start alike share one prefill of their head, padding after it; each then decodes what it
    decodes alone (greedy: the same tokens, log-probs to rounding). Sliding windows do not share: padding
    inside a window would hide real tokens."""
    model = _architecture(name).eval()
    prompts = [HEAD + p[1:] for p in PROMPTS]  # rests of 4 to 6 tokens: padding between head and rest
    windowed = name not in PACKABLE
    assert shared_head(model, prompts) == (0 if windowed else len(HEAD))
    forwards = _forwards(model)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    together = generate_with_model(model, prompts, params, 2, eos_ids=[2], pad_id=0)
    # The head once, then each prompt's rest (else each prompt whole), then 2 samples of each at a time.
    prefill = [(3, len(HEAD) + 6)] if windowed else [(1, len(HEAD)), (3, 6)]
    assert forwards[: len(prefill) + 1] == prefill + [(6, 1)]
    for prompt, group in zip(prompts, together):
        alone = generate_with_model(model, [prompt], params, 1, eos_ids=[2], pad_id=0)[0][0]
        for generation in group:
            assert generation.token_ids == alone.token_ids
            assert generation.logp_behav == pytest.approx(alone.logp_behav, abs=2e-5)


def test_a_head_is_shared_only_where_it_saves_a_forward():
    model = _architecture("llama")
    assert shared_head(model, [HEAD + [5]]) == 0  # one prompt
    assert shared_head(model, [HEAD + [5], HEAD + [6]]) == 0  # 18 tokens saved: below HEAD_TOKENS_SAVED
    assert shared_head(model, [HEAD + [5], HEAD + [6], HEAD + [7]]) == 18
    assert shared_head(model, [HEAD, HEAD + [6], HEAD + [7, 8]]) == 17  # each keeps its last token
    assert shared_head(model, [HEAD + [5], [2] + HEAD, HEAD + [7]]) == 0
