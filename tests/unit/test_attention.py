"""Grouped-query attention in place on CPU (`asyncrl.core.model.attention`): the same bits as transformers'
own "sdpa" forward, gradients to rounding, and the kernel sees the key heads unrepeated."""

import torch
from torch.profiler import profile
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from asyncrl.core.model.attention import _sdpa, use_cpu_gqa

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 16


class _Module(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def _inputs(batch=3, q_len=5, kv_len=9, pad=(0, 2, 4)):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, HEADS, q_len, HEAD_DIM, generator=gen, requires_grad=True)
    k = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, generator=gen, requires_grad=True)
    v = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, generator=gen, requires_grad=True)
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    mask = causal.expand(batch, 1, q_len, kv_len).clone()
    for row, left in enumerate(pad):  # left padding, as a decode batch has it (every query keeps a key)
        mask[row, :, :, :left] = False
    return q, k, v, mask


def test_grouped_heads_in_place_give_transformers_bits_and_its_gradients():
    for q_len in (1, 5):  # a decode step, a prefill or training forward
        q, k, v, mask = _inputs(q_len=q_len)
        ours, _ = _sdpa(_Module(), q, k, v, mask, scaling=HEAD_DIM ** -0.5)
        theirs, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=HEAD_DIM ** -0.5)
        assert torch.equal(ours, theirs)
        ours_grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
        theirs_grads = torch.autograd.grad(theirs.square().sum(), (q, k, v))
        for a, b in zip(ours_grads, theirs_grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_calls_it_does_not_cover_go_to_transformers_unchanged():
    q, k, v, _ = _inputs()
    ours, _ = _sdpa(_Module(), q, k, v, None, scaling=HEAD_DIM ** -0.5)  # no mask: transformers' causal path
    theirs, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=HEAD_DIM ** -0.5)
    assert torch.equal(ours, theirs)


def test_a_model_loaded_by_asyncrl_attends_without_repeating_its_key_heads():
    use_cpu_gqa()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=HEADS * HEAD_DIM, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with profile(record_shapes=True) as prof, torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    shapes = [e.input_shapes for e in prof.events() if e.name == "aten::scaled_dot_product_attention"]
    assert shapes and all(s[1][1] == KV_HEADS for s in shapes)  # the key as the layer made it
    model.set_attn_implementation("eager")  # the reference: repeated heads, explicit softmax
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits[:, 2:], reference[:, 2:], rtol=1e-5, atol=1e-5)
