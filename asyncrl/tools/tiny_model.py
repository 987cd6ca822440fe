"""`asyncrl make-tiny-model`: tiny policy and teacher checkpoints, built locally (no model hub).

A tokenizer (the arith task's character tokenizer, or `tiny_model.tokenizer_path`: any Hugging Face
tokenizer directory, e.g. a BPE tokenizer with a chat template), a small `Qwen2`, or with
`tiny_model.architecture: qwen3_moe` a `Qwen3-MoE` (attention head size 64, what vLLM's CPU kernels accept)
with random weights, then a short supervised warm start on the task's
reference answers so RL starts from a sensible but imperfect policy (`tiny_model.warmstart_steps`, saved at
`model.path`); when the teacher is enabled it continues the same run to `tiny_model.teacher_steps` in total
(a stronger model of the same shape, saved at `teacher.model_path`). Float32 safetensors checkpoints with
the tokenizer next to them. A stamp file (a hash of the tiny_model, task and reward config and the
tokenizer's files) makes the build a no-op when the checkpoints already match.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.core.agents.factory import Episodes
from asyncrl.core.agents.reference import reference_episode
from asyncrl.core.model.modeling import sequence_logprobs
from asyncrl.core.model.tokenizer import ARITH_ALPHABET, ModelTokenizer, build_char_tokenizer, save_tokenizer
from asyncrl.core.tasks import Task, get_task
from asyncrl.core.tasks.registry import TASKS
from asyncrl.tools.tiny_model_stamp import (
    SFT_BATCH_SIZE,
    SFT_TEACHER_FINAL_LR,
    SFT_WARMUP_STEPS,
    STAMP_FILE,
    WARMSTART_CHECK_STEPS,
    config_stamp,
    sft_peak_lr,
    tiny_models_current,
)

log = logging.getLogger(__name__)

HEAD_SIZE = 64


@dataclass(frozen=True)
class TinyModelPaths:
    policy: Path
    teacher: Path | None
    built: bool
    """False when both checkpoints were already there with a matching stamp."""


def model_config(tiny_cfg, codec):
    """The transformers config of the tiny model around `codec` (a `ModelTokenizer`): `Qwen2Config` or, for
    `architecture: qwen3_moe`, `Qwen3MoeConfig` (every layer sparse). Validates the head size vLLM's CPU
    attention needs."""
    from transformers import Qwen2Config, Qwen3MoeConfig

    heads, kv_heads = tiny_cfg.num_attention_heads, tiny_cfg.num_key_value_heads
    if tiny_cfg.hidden_size != heads * HEAD_SIZE:
        raise ValueError(
            f"tiny_model.hidden_size ({tiny_cfg.hidden_size}) / num_attention_heads ({heads}) must be "
            f"{HEAD_SIZE} (vLLM's CPU attention kernels support head size {HEAD_SIZE})"
        )
    if heads % kv_heads:
        raise ValueError(
            f"tiny_model.num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    common = {
        "vocab_size": codec.vocab_size,
        "hidden_size": tiny_cfg.hidden_size,
        "intermediate_size": tiny_cfg.intermediate_size,
        "num_hidden_layers": tiny_cfg.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_SIZE,
        "max_position_embeddings": tiny_cfg.max_positions,
        "bos_token_id": codec.bos_id,
        "eos_token_id": codec.eos_id,
        "pad_token_id": codec.pad_id,
        "tie_word_embeddings": False,
    }
    if tiny_cfg.architecture == "qwen2":
        return Qwen2Config(**common)
    if tiny_cfg.num_experts_per_tok > tiny_cfg.num_experts:
        raise ValueError(
            f"tiny_model.num_experts_per_tok ({tiny_cfg.num_experts_per_tok}) must be <= num_experts "
            f"({tiny_cfg.num_experts})"
        )
    return Qwen3MoeConfig(
        **common,
        num_experts=tiny_cfg.num_experts,
        num_experts_per_tok=tiny_cfg.num_experts_per_tok,
        moe_intermediate_size=tiny_cfg.moe_intermediate_size,
        # Qwen3-MoE's released models renormalise the top-k gates; the auxiliary balance loss stays off.
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=False,
    )


def _sft_batch(task: Task, first_index: int, size: int, episodes=None):
    """(sequences, response starts, train masks or None): the target responses, or with `episodes` (multi-turn)
    the reference episodes, their observations out of the loss."""
    sequences, starts, masks = [], [], []
    for index in range(first_index, first_index + size):
        prompt = task.train_prompt(index)
        if episodes is not None:
            context, response, mask = reference_episode(episodes, task, prompt)
            sequences.append(context + response)
            starts.append(len(context))
            masks.append(mask)
            continue
        target = task.tokenizer.encode_text(task.target_text(prompt)) + [task.tokenizer.eos_ids[0]]
        sequences.append(prompt.token_ids + target)
        starts.append(len(prompt.token_ids))
    if not masks:
        return sequences, starts, None
    width = max(map(len, masks))
    return sequences, starts, torch.tensor([m + [0.0] * (width - len(m)) for m in masks])


def sft_lr(step: int, width: int, decay: bool = False, first_step: int = 0, last_step: int = 0) -> float:
    """Learning rate of SFT step `step` of a model `width` wide: linear warm-up to `sft_peak_lr(width)`, then
    constant, or (decay=True) a linear decay from the full rate at `first_step` to SFT_TEACHER_FINAL_LR of it
    at `last_step`."""
    lr = sft_peak_lr(width) * min(1.0, (step + 1) / SFT_WARMUP_STEPS)
    if decay:
        frac = (step - first_step) / max(1, last_step - first_step)
        lr *= 1.0 - (1.0 - SFT_TEACHER_FINAL_LR) * frac
    return lr


def supervised_train(
    model,
    task: Task,
    steps: int,
    first_step: int = 0,
    optimizer=None,
    decay: bool = False,
    log_every: int = 100,
    episodes=None,
):
    """Cross-entropy on the target response tokens (EOS included) of training prompts; returns the optimizer.

    Step s uses training prompts [s * SFT_BATCH_SIZE, (s + 1) * SFT_BATCH_SIZE), so continuing a run
    (`first_step`) sees new data, and the result is a pure function of the seeds. `decay`: see `sft_lr`.
    `episodes` (multi-turn tasks): train on reference episodes, the model's tokens only.
    """
    model.train()
    width = model.config.hidden_size
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=sft_peak_lr(width), weight_decay=0.0)
    started = time.perf_counter()
    for step in range(first_step, first_step + steps):
        for group in optimizer.param_groups:
            group["lr"] = sft_lr(step, width, decay, first_step, first_step + steps)
        sequences, starts, train_mask = _sft_batch(task, step * SFT_BATCH_SIZE, SFT_BATCH_SIZE, episodes)
        logp, mask = sequence_logprobs(model, sequences, starts, None, pad_id=task.tokenizer.pad_id)
        if train_mask is not None:
            mask = mask * train_mask[:, : mask.shape[1]]
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if log_every and (step + 1) % log_every == 0:
            log.info("sft step %d loss %.4f (%.1fs)", step + 1, loss.item(), time.perf_counter() - started)
    model.eval()
    return optimizer


def _save(model, save_tokenizer_to, directory: Path, stamp: str, info: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_tokenizer_to(directory)
    (directory / STAMP_FILE).write_text(json.dumps({"stamp": stamp, **info}, indent=2) + "\n")


def _tokenizer(config):
    """(ModelTokenizer, how to save it next to a checkpoint)."""
    tiny = config.tiny_model
    if tiny.tokenizer_path:
        tokenizer = ModelTokenizer.load(tiny.tokenizer_path)
        return tokenizer, lambda directory: tokenizer.hf.save_pretrained(str(directory))
    alphabet, specials, template = getattr(TASKS.get(config.task.name), "CHAR_TOKENIZER", (ARITH_ALPHABET, (), None))
    tok = build_char_tokenizer(alphabet, specials)
    return ModelTokenizer.from_tokenizers(tok, template), lambda directory: save_tokenizer(
        tok, directory, model_max_length=tiny.max_positions, chat_template=template
    )


def longest_warm_start(tiny) -> int:
    """Most supervised steps the warm start can take: warmstart_steps, twice that with an accuracy target."""
    return tiny.warmstart_steps * (2 if tiny.warmstart_until_accuracy is not None else 1)


def warm_start(model, task: Task, tiny, accuracy, episodes=None) -> tuple[object, int, float | None]:
    """`tiny.warmstart_steps` supervised steps, then (`tiny.warmstart_until_accuracy`) WARMSTART_CHECK_STEPS
    more at a time until `accuracy()` reaches the target or the steps have doubled. Returns the optimizer, the
    steps taken and the last accuracy measured (None when none was)."""
    optimizer = supervised_train(model, task, tiny.warmstart_steps, episodes=episodes)
    steps, acc = tiny.warmstart_steps, None
    if tiny.warmstart_until_accuracy is None:
        return optimizer, steps, acc
    while (acc := accuracy()) < tiny.warmstart_until_accuracy and steps < longest_warm_start(tiny):
        log.info("warm start: greedy accuracy %.3f after %d steps, below %.3f", acc, steps,
                 tiny.warmstart_until_accuracy)
        extra = min(WARMSTART_CHECK_STEPS, longest_warm_start(tiny) - steps)
        supervised_train(model, task, extra, steps, optimizer, episodes=episodes, log_every=0)
        steps += extra
    return optimizer, steps, acc


def make_tiny_model(config) -> TinyModelPaths:
    """Build (or reuse) the tiny policy at `config.model.path` and, when the teacher is enabled, the teacher at
    `config.teacher.model_path`."""
    tiny = config.tiny_model
    if not config.model.path:
        raise ValueError("model.path: required: where to build the tiny policy")
    policy_dir = Path(config.model.path)
    teacher_dir = Path(config.teacher.model_path) if config.teacher.enabled else None
    stamp = config_stamp(config)
    if tiny_models_current(config):
        log.info("tiny model up to date (stamp %s): %s, %s", stamp, policy_dir, teacher_dir)
        return TinyModelPaths(policy_dir, teacher_dir, built=False)
    # Only to build: `asyncrl up` checks the stamp before every run, and transformers takes a second to load.
    from transformers import AutoModelForCausalLM

    from asyncrl.core.engines.torch_decode import generate_with_model
    from asyncrl.core.tasks.evaluate import greedy_accuracy
    if config.teacher.enabled and tiny.teacher_steps < longest_warm_start(tiny):
        raise ValueError(
            f"tiny_model.teacher_steps ({tiny.teacher_steps}) must be >= the longest warm start "
            f"({longest_warm_start(tiny)}: warmstart_steps, twice that with warmstart_until_accuracy): the teacher "
            "continues the warm-start run"
        )

    tokenizer, save_tokenizer_to = _tokenizer(config)
    task = get_task(config.task, tokenizer, config.reward)
    episodes = Episodes.for_task(config.environment, task, tiny.max_positions)
    torch.manual_seed(tiny.seed)
    model = AutoModelForCausalLM.from_config(model_config(tiny, tokenizer)).float()
    log.info(
        "tiny model: %d parameters, vocabulary %d; warm start %d steps, teacher %d steps",
        sum(p.numel() for p in model.parameters()),
        tokenizer.vocab_size,
        tiny.warmstart_steps,
        tiny.teacher_steps,
    )

    def accuracy() -> float:
        def generate(prompts, params, n):
            return generate_with_model(model, prompts, params, n, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id)

        return greedy_accuracy(generate, task, max_new_tokens=task.max_response_tokens or config.sampling.max_new_tokens,
                               episodes=episodes)

    started = time.perf_counter()

    def save(role: str, directory: Path, sft_steps: int, acc: float | None = None) -> None:
        acc = accuracy() if acc is None else acc
        _save(model, save_tokenizer_to, directory, stamp, {"sft_steps": sft_steps, "greedy_accuracy": acc})
        log.info("%s saved to %s: greedy accuracy %.3f (%.1fs)", role, directory, acc, time.perf_counter() - started)

    optimizer, warm_steps, warm_accuracy = warm_start(model, task, tiny, accuracy, episodes)
    save("policy", policy_dir, warm_steps, warm_accuracy)
    if teacher_dir is not None:
        # The teacher continues the same run: a stronger model of the same shape and tokenizer.
        teacher_extra = tiny.teacher_steps - warm_steps
        supervised_train(model, task, teacher_extra, warm_steps, optimizer, decay=True, episodes=episodes)
        save("teacher", teacher_dir, tiny.teacher_steps)
    return TinyModelPaths(policy_dir, teacher_dir, built=True)


def run(config) -> TinyModelPaths:
    """CLI entry (`asyncrl make-tiny-model`): build or reuse the tiny checkpoints (with learner.threads)."""
    if config.learner.threads > 0:
        torch.set_num_threads(config.learner.threads)
    return make_tiny_model(config)
