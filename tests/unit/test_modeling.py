"""`sequence_logprobs` against hand loops of single forwards; weight naming and push validation."""

import pytest
import torch

from asyncrl.core.model.modeling import (
    check_weight_metas,
    copy_weights_,
    named_weights,
    padded_rows,
    sequence_logprobs,
)
from asyncrl.core.model.sampling import SamplingParams, processed_logprobs
from asyncrl.core.wire.push_contract import TensorMeta, tensor_metas

PAD = 0


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=16,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=2,
    )
    # A larger init than the default 0.02 so the next-token distributions are far from uniform.
    cfg.initializer_range = 0.5
    return Qwen2ForCausalLM(cfg).eval()


SEQUENCES = [[1, 5, 6, 14, 7, 8, 15, 8, 4, 2], [1, 9, 14, 9, 15, 5, 12], [1, 4, 14, 4, 15, 4, 2, 3, 3]]
STARTS = [7, 5, 5]


def _hand_loop(model, seq, start, params):
    """log-prob of seq[t] for t >= start from one unbatched forward of the prefix seq[:t] per token."""
    out = []
    for t in range(start, len(seq)):
        with torch.no_grad():
            logits = model(torch.tensor([seq[:t]])).logits[0, -1]
        logp = torch.log_softmax(logits.float(), -1) if params is None else processed_logprobs(logits, params)
        out.append(logp[seq[t]].item())
    return out


@pytest.mark.parametrize(
    "params", [None, SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=6, top_p=0.9)]
)
def test_matches_hand_loop_of_single_forwards(model, params):
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, SEQUENCES, STARTS, params, pad_id=PAD)
    assert logp.dtype == torch.float32 and mask.dtype == torch.bool
    assert logp.shape == mask.shape == (3, 4)
    assert mask.tolist() == [[True, True, True, False], [True, True, False, False], [True] * 4]
    for i, (seq, start) in enumerate(zip(SEQUENCES, STARTS)):
        expected = _hand_loop(model, seq, start, params)
        n = len(expected)
        assert logp[i, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert torch.all(logp[i, n:] == 0)


def test_padding_and_batch_company_do_not_change_values(model):
    with torch.no_grad():
        alone, _ = sequence_logprobs(model, SEQUENCES[1:2], STARTS[1:2], None, pad_id=PAD)
        batched, _ = sequence_logprobs(model, SEQUENCES, STARTS, None, pad_id=PAD)
        other_pad, _ = sequence_logprobs(model, SEQUENCES, STARTS, None, pad_id=9)
    assert batched[1, :2].tolist() == pytest.approx(alone[0].tolist(), abs=1e-5)
    assert torch.allclose(batched, other_pad, atol=1e-5)


def test_logprobs_are_differentiable(model):
    logp, mask = sequence_logprobs(model, SEQUENCES, STARTS, SamplingParams(temperature=0.9), pad_id=PAD)
    (-(logp * mask).sum()).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0
    model.zero_grad(set_to_none=True)


def test_chunked_vocab_projection_matches(model, monkeypatch):
    from asyncrl.core.model import modeling

    full, _ = sequence_logprobs(model, SEQUENCES, STARTS, None, pad_id=PAD)
    # 16-token vocabulary, 48 elements -> chunks of 3 response tokens (with grad: checkpointed chunks).
    monkeypatch.setattr(modeling, "_MAX_LOGIT_ELEMENTS", 48)
    chunked, mask = sequence_logprobs(model, SEQUENCES, STARTS, None, pad_id=PAD)
    assert torch.allclose(full, chunked, atol=1e-6)
    (-(chunked * mask).sum()).backward()
    assert model.lm_head.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_empty_responses_and_bad_starts(model):
    logp, mask = sequence_logprobs(model, [[1, 5, 6]], [3], None, pad_id=PAD)
    assert logp.shape == (1, 0) and mask.shape == (1, 0)
    with pytest.raises(ValueError, match="response_start=0"):
        sequence_logprobs(model, [[1, 5]], [0], None, pad_id=PAD)
    with pytest.raises(ValueError, match="response_start=4"):
        sequence_logprobs(model, [[1, 5]], [4], None, pad_id=PAD)
    with pytest.raises(ValueError, match="2 sequences but 1"):
        sequence_logprobs(model, [[1, 5], [1, 6]], [1], None, pad_id=PAD)


def test_padded_rows_pad_after_or_before_the_tokens():
    ids, mask = padded_rows([[5, 6, 7], [8], [9, 4]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 4, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    ids, mask = padded_rows([[5, 6, 7], [8]], pad_id=3, left=True)
    assert ids.tolist() == [[5, 6, 7], [3, 3, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = padded_rows([[], []], pad_id=0)  # rows without tokens keep their shape
    assert ids.shape == mask.shape == (2, 0)


def test_named_weights_load_with_state_dict_names(model):
    from transformers import Qwen2ForCausalLM

    named = named_weights(model)
    names = [n for n, _ in named]
    assert names == [n for n, _ in named_weights(model)]  # stable order
    assert len(names) == len(set(names)) and "lm_head.weight" in names
    clone = Qwen2ForCausalLM(model.config)
    clone.load_state_dict(dict(named), strict=True)
    with torch.no_grad():
        assert torch.equal(
            clone(torch.tensor([SEQUENCES[0]])).logits, model(torch.tensor([SEQUENCES[0]])).logits
        )


def test_check_weight_metas(model):
    metas = tensor_metas(named_weights(model))
    targets = check_weight_metas(model, metas)
    assert list(targets) == [m.name for m in metas]
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    bad_shape = tuple(TensorMeta(m.name, (1, 2), m.dtype) if m.name == k_proj else m for m in metas)
    with pytest.raises(ValueError, match=f"{k_proj}.*shape \\(1, 2\\).*model.s is \\(64, 64\\)"):
        check_weight_metas(model, bad_shape)
    with pytest.raises(ValueError, match="'nope'"):
        check_weight_metas(model, metas + (TensorMeta("nope", (1,), "float32"),))
    with pytest.raises(ValueError, match="lacks 1 of the model.s tensors"):
        check_weight_metas(model, metas[1:])
    with pytest.raises(ValueError, match="twice"):
        check_weight_metas(model, metas + metas[:1])
    with pytest.raises(ValueError, match="dtype int64"):
        check_weight_metas(model, tuple(TensorMeta(m.name, m.shape, "int64") for m in metas))


def test_copy_weights_counts_bytes(model):
    from transformers import Qwen2ForCausalLM

    clone = Qwen2ForCausalLM(model.config)
    targets = check_weight_metas(clone, tensor_metas(named_weights(model)))
    nbytes = copy_weights_(targets, named_weights(model))
    assert nbytes == sum(p.numel() * 4 for p in model.parameters())
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(named_weights(clone), named_weights(model)))


def test_a_loaded_model_gives_its_head_a_contiguous_input(tiny_model_dir):
    """A prefill keeps only the last position's logits: a strided slice, which torch's CPU linear would take as
    one matrix-vector product per row (`modeling._contiguous_input`)."""
    from asyncrl.core.model.modeling import load_causal_lm

    model = load_causal_lm(tiny_model_dir.policy)
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 5, 6], [1, 7, 8]]), logits_to_keep=1)
    assert seen == [True]
