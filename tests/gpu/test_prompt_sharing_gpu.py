"""Shared-prompt forwards (`asyncrl.core.model.prompt_sharing`) on CUDA: the kernels differ from the CPU's (SDPA's
flash / memory-efficient paths under left padding, where a padded prompt position attends to nothing), so
the equality with the one-forward path that tests/unit/test_prompt_sharing.py shows on CPU is checked here
again for both layouts (KV copy, packed rows under a boolean mask), with gradients, in float32 and bfloat16. Skipped without a CUDA GPU (CI never has one)."""

import pytest
import torch

from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.model.packing import packed_logprobs
from asyncrl.core.model.prompt_sharing import kv_copy_logprobs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Prompts of different lengths (left padding), responses of different lengths (right padding), 4 per prompt.
PROMPTS = [[1, 5, 6, 14, 7, 8, 15], [1, 9, 14, 9, 15], [1, 12, 13, 14, 4, 15]]
SEQUENCES = [p + [3 + (k + j) % 10] * (1 + k % 4) + [2] for j, p in enumerate(PROMPTS) for k in range(4)]
STARTS = [len(p) for p in PROMPTS for _ in range(4)]


def _logprobs_and_grads(model, forward):
    model.zero_grad(set_to_none=True)
    logp, mask = forward(model, SEQUENCES, STARTS, None, 0)
    weights = torch.linspace(0.5, 1.5, logp.numel(), device=logp.device).view_as(logp)
    (logp.float() * weights * mask).sum().backward()
    return logp.detach().float(), mask, {n: p.grad.float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["kv_copy", "packed"])
@pytest.mark.parametrize(("dtype", "logp_atol", "grad_rel"), [("float32", 1e-4, 1e-3), ("bfloat16", 0.1, 0.05)])
def test_cuda_shared_prompts_train_as_the_one_forward_does(tiny_model_dir, dtype, logp_atol, grad_rel, layout):
    model = load_causal_lm(tiny_model_dir.policy, dtype=dtype, device="cuda").train()
    expected, expected_mask, expected_grads = _logprobs_and_grads(model, sequence_logprobs)
    forward = packed_logprobs if layout == "packed" else kv_copy_logprobs
    logp, mask, grads = _logprobs_and_grads(model, forward)
    assert torch.equal(mask, expected_mask)
    assert torch.isfinite(logp).all() and all(torch.isfinite(g).all() for g in grads.values())
    worst = (logp - expected)[mask].abs().max().item()
    print(f"cuda {dtype} {layout}: max |logp shared - whole| {worst:.2e}")
    assert worst <= logp_atol
    for name, grad in grads.items():
        want = expected_grads[name]
        # Relative to the gradient's own scale: bfloat16 rounds each partial sum differently per path.
        assert (grad - want).norm() <= grad_rel * want.norm() + 1e-6, name
