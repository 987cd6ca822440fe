"""Fixtures and reference helpers for the real-vLLM tests (also used by tests/gpu/test_vllm_gpu.py).

The tiny random checkpoints are built on the spot (nothing is downloaded) and are self-contained on purpose
(their own tokenizer and config), so these tests do not depend on the project's model helpers. Their shape
follows what vLLM's CPU kernels accept: attention head size 64. The references are in-process transformers
forwards of the same weights.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch

from asyncrl.core.model.sampling import SamplingParams, processed_logprobs
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import send_weights

# Characters of the toy vocabulary; ids 0 and 1 are the special tokens.
TINY_SYMBOLS = list("0123456789+-*=") + [" "]
PAD_TOKEN, EOS_TOKEN = "<pad>", "<eos>"


def build_tiny_tokenizer(out_dir: Path):
    """A character-level WordLevel tokenizer saved as a Hugging Face tokenizer directory."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD_TOKEN: 0, EOS_TOKEN: 1}
    for symbol in TINY_SYMBOLS:
        vocab[symbol] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD_TOKEN))
    # Every character is its own token (digits included), so prompts map one character to one id.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_tiny_qwen2(out_dir: Path, seed: int = 0) -> Path:
    """Random tiny Qwen2 (vocab 64, hidden 128, 2 layers, 2 heads of 64, 1 KV head) in float32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out_dir)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        # Larger than the default 0.02 so the random model is peaked enough for top-k/top-p to matter.
        initializer_range=0.3,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def build_tiny_qwen3_moe(out_dir: Path, seed: int = 0) -> Path:
    """Random tiny Qwen3-MoE (8 experts, top-2, 2 layers, heads of 64) in float32, same tokenizer."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out_dir)
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        initializer_range=0.3,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3MoeForCausalLM(config).to(torch.float32).save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory) -> str:
    """Directory of the tiny random Qwen2 checkpoint (config, safetensors weights, tokenizer)."""
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2")))


def logits_of(model, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] next-token logits for every prefix of `tokens`."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def reference_logp(
    model, prompt: list[int], response: list[int], params: SamplingParams | None
) -> torch.Tensor:
    """Log-probs of `response` after `prompt`: processed with `params`, or raw when `params` is None."""
    logits = logits_of(model, prompt + response)[len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits, -1) if params is None else processed_logprobs(logits, params)
    return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def perturbed(model, seed: int, scale: float = 0.2):
    """A copy of `model` with every parameter moved by Gaussian noise."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


def push(engine, model, version: int, bucket_bytes: int = 64 * 1024, transport: str = "gloo", device=None):
    """Push `model`'s weights to `engine` through a real broadcast from a sender thread (rank 0).

    Small buckets by default, so one layer's tensors are spread over several broadcasts. For nccl the sender
    holds its tensors on `device` (a GPU other than the engine's: NCCL wants one rank per GPU).
    """
    named = [(name, p.detach().to(device or "cpu").contiguous()) for name, p in model.named_parameters()]
    return push_named(engine, named, version, bucket_bytes, transport, device)


def push_named(engine, named, version: int, bucket_bytes: int = 64 * 1024, transport: str = "gloo", device=None,
               adapter=None):
    """`push` of the tensors `named`; `adapter`: their `AdapterSpec` when they are a LoRA adapter."""
    store = host_store("127.0.0.1", 0, timeout_s=60)
    plan = PushPlan(
        push_id=f"test-push-{version}",
        version=version,
        store_address=f"127.0.0.1:{store.port}", store_key=store.key,
        world_size=2,
        transport=transport,
        tensors=tensor_metas(named),
        bucket_bytes=bucket_bytes,
        timeout_s=60,
        adapter=adapter,
    )
    sent: dict = {}

    def sender():
        try:
            if device is not None:
                torch.cuda.set_device(device)  # per thread: the nccl group takes the current device
            group = make_group(plan, 0, store)
            sent["bytes"] = send_weights(group, named, plan)
            group.close()
        except Exception as exc:  # noqa: BLE001  (a refused push: the sender gives up when its wait ends)
            sent["error"] = exc

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    stats = engine.update_weights(plan, rank=1)
    thread.join(timeout=60)
    assert sent.get("bytes") == plan.total_bytes, sent.get("error")
    return stats, plan
