"""`asyncrl probe`: training-inference mismatch of the rollout engine vs the learner (the TIM measurement).

Same weights on both sides. The engine samples responses (recording logp_behav) and decodes greedily; the
learner's model scores the sampled tokens with the same processed distribution and takes its own argmax
along the engine's greedy path. Reported per response token: δ_t = logp_learner - logp_engine (mean,
mean |δ|, max |δ|), KL(engine || learner) estimates (k1, k3), the PPL ratio, and the fraction of greedy
positions where the learner's argmax differs from the engine's token (argmax flips). Both sides run as
`model.determinism` sets them: in bitwise mode the learner's model runs on the engine's batch-invariant
computations, and every δ is exactly 0 (`exact_tokens` counts the tokens where it is).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from asyncrl.core.determinism.invariant_model import use_invariant_kernels
from asyncrl.core.determinism.modes import invariant_learner
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.model.modeling import load_causal_lm, pad_token_id, sequence_logprobs
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.tasks import task_for_run


def mismatch_stats(logp_learner: torch.Tensor, logp_engine: torch.Tensor, mask: torch.Tensor) -> dict:
    """δ statistics over the masked response tokens (pure)."""
    m = mask.bool()
    delta = (logp_learner - logp_engine)[m]
    log_ratio = -delta  # log(p_engine / p_learner) at tokens sampled from the engine
    k1 = log_ratio.mean().item()
    k3 = (torch.exp(-log_ratio) - 1 + log_ratio).mean().item()
    return {
        "tokens": int(m.sum().item()),
        "delta_mean": delta.mean().item(),
        "delta_abs_mean": delta.abs().mean().item(),
        "delta_abs_max": delta.abs().max().item(),
        "exact_tokens": int((delta == 0).sum().item()),
        "kl_engine_learner_k1": k1,
        "kl_engine_learner_k3": k3,
        "ppl_ratio_learner_over_engine": math.exp(-(logp_learner[m].mean() - logp_engine[m].mean()).item()),
    }


def argmax_flips(model, sequences: list[list[int]], starts: list[int], pad_id: int) -> tuple[int, int]:
    """Positions along the engine's greedy responses where the learner's argmax picks another token."""
    flips = total = 0
    with torch.no_grad():
        for seq, start in zip(sequences, starts):
            if len(seq) <= start:
                continue
            ids = torch.tensor([seq])
            logits = model(input_ids=ids).logits[0]
            predicted = logits[start - 1 : len(seq) - 1].argmax(dim=-1)
            flips += int((predicted != ids[0, start:]).sum())
            total += len(seq) - start
    return flips, total


def run(config, num_prompts: int = 64, out: str | None = None) -> dict:
    torch.manual_seed(config.seed)
    task = task_for_run(config)
    prompts = [task.train_prompt(i).token_ids for i in range(num_prompts)]
    params = SamplingParams.from_config(config.sampling)
    t0 = time.perf_counter()
    mode = config.model.determinism
    engine = make_engine(config.rollout.engine, config.model.path, config.model.dtype, seed=config.seed,
                         determinism=mode)
    start_s = time.perf_counter() - t0
    try:
        sampled = [g[0] for g in engine.generate(prompts, params, n=1)]
        greedy = [g[0] for g in engine.generate(prompts, SamplingParams(max_new_tokens=params.max_new_tokens,
                                                                        greedy=True), n=1)]
    finally:
        engine.close()
    model = load_causal_lm(config.model.path, config.model.dtype, config.learner.device)
    if invariant_learner(mode):
        use_invariant_kernels(model)
    model.eval()
    pad = pad_token_id(model)
    seqs = [list(p) + g.token_ids for p, g in zip(prompts, sampled)]
    starts = [len(p) for p in prompts]
    with torch.no_grad():
        logp_learner, mask = sequence_logprobs(model, seqs, starts, params, pad)
    logp_engine = torch.zeros_like(logp_learner)
    for i, g in enumerate(sampled):
        logp_engine[i, : len(g.logp_behav)] = torch.tensor(g.logp_behav)
    report = {
        "probe": "mismatch", "engine": config.rollout.engine.type, "model": config.model.path,
        "dtype": config.model.dtype, "determinism": mode, "prompts": num_prompts, "temperature": params.temperature,
        "top_k": params.top_k, "top_p": params.top_p, "engine_start_s": round(start_s, 2),
        **mismatch_stats(logp_learner, logp_engine, mask),
    }
    flips, total = argmax_flips(model, [list(p) + g.token_ids for p, g in zip(prompts, greedy)], starts, pad)
    report.update({"greedy_tokens": total, "argmax_flip_frac": flips / max(1, total)})
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    return report
