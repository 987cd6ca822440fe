"""Learner-step cost of the objective library: every correction on vs. plain PPO, same batch, one run.

A step = forward with grad (logp) + build_advantages + policy_objective (incl. all diagnostics) + backward.
The proximal forward is excluded (logp_prox, logp_ref and logp_teacher are precomputed inputs), as is the
optimizer step, which both configurations share. Configurations alternate inside one loop so drift in machine
load hits both alike; each reports the median of the timed repeats after warm-up.

Two models are timed: "transformer" (the demo model's shape: width 128, 2 layers, 2 heads, FFN 512, vocab 64,
prompt 16 + response 32 tokens, N = 64) -- the target ratio <= 1.15 applies here -- and "linear_head" (logits
from one linear layer over fixed features, [N=64, T=32, V=64]), where the model costs almost nothing and the
ratio shows the objective's own overhead.

    .venv/bin/python bench/learner_step.py [--repeats 30] [--warmup 5] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import emit
from torch import nn

from asyncrl.learner.algos import AlgoConfig, build_advantages, policy_objective

N, PROMPT, T, V, GROUP = 64, 16, 32, 64, 8

PLAIN_PPO = AlgoConfig(preset="disabled")
ALL_ON = AlgoConfig.model_validate({
    "preset": "decoupled_geo_rs_token_tis",
    "rollout_correction": {"veto_threshold": 1e-4, "batch_normalize": True, "rejection_lower": 0.99,
                           "rejection_upper": 1.01},
    "policy_loss": {"dual_clip_c": 3.0, "clip_eps_high": 0.28},
    "kl": {"mode": "loss", "estimator": "k3", "coef": 1e-3, "loss_is_correction": True},
    "opd": {"enabled": True, "mode": "loss", "horizon": 16, "coef": 0.1},
    "advantage": {"dash_threshold": 0.0},  # the filter runs but keeps every row, so both steps train on N rows
    "length_penalty": {"type": "group", "beta": 0.1},
})


class TinyCausalLM(nn.Module):
    def __init__(self, width: int = 128, layers: int = 2, heads: int = 2, ffn: int = 512):
        super().__init__()
        self.embed = nn.Embedding(V, width)
        self.pos = nn.Embedding(PROMPT + T, width)
        layer = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.embed(tokens) + self.pos(torch.arange(length, device=tokens.device))
        return self.head(self.body(h, mask=causal, is_causal=True))


def response_logp(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """log pi of each response token given its prefix: [N, T]."""
    logits = model(tokens[:, :-1])[:, PROMPT - 1:]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, PROMPT:].unsqueeze(-1)).squeeze(-1)


class LinearHead(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.features = nn.Parameter(torch.randn(N, T, width), requires_grad=False)
        self.head = nn.Linear(width, V)


def linear_logp(model: LinearHead, tokens: torch.Tensor) -> torch.Tensor:
    logits = model.head(model.features)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, PROMPT:].unsqueeze(-1)).squeeze(-1)


def make_batch(device: str, logp_fn, model) -> dict:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (N, PROMPT + T), generator=gen)
    lengths = torch.randint(8, T + 1, (N,), generator=gen)
    mask = (torch.arange(T).view(1, -1) < lengths.view(-1, 1)).float()
    rewards = (torch.rand(N, generator=gen) < 0.4).float()

    def noise(scale: float) -> torch.Tensor:
        return scale * torch.randn(N, T, generator=gen)

    tokens, mask, rewards = tokens.to(device), mask.to(device), rewards.to(device)
    with torch.no_grad():
        logp_prox = logp_fn(model, tokens)
    return {
        "tokens": tokens, "mask": mask, "rewards": rewards,
        "group_index": torch.arange(N, device=device) // GROUP,
        "logp_prox": logp_prox,
        "logp_behav": logp_prox + noise(0.002).to(device),
        "logp_ref": logp_prox + noise(0.05).to(device),
        "logp_teacher": logp_prox + noise(0.5).to(device),
    }


def one_step(model, logp_fn, batch: dict, cfg: AlgoConfig) -> None:
    model.zero_grad(set_to_none=True)
    adv = build_advantages(batch["rewards"], batch["group_index"], batch["mask"], cfg,
                           logp_prox=batch["logp_prox"], logp_teacher=batch["logp_teacher"])
    logp = logp_fn(model, batch["tokens"])
    loss, _metrics = policy_objective(logp, batch["logp_prox"], batch["logp_behav"], adv.advantages, batch["mask"],
                                      cfg, logp_ref=batch["logp_ref"], logp_teacher=batch["logp_teacher"],
                                      opd_mask=adv.opd_mask)
    loss.backward()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_pair(model, logp_fn, batch: dict, warmup: int, repeats: int, device: str) -> dict:
    configs = {"plain_ppo": PLAIN_PPO, "all_corrections": ALL_ON}
    times: dict[str, list[float]] = {name: [] for name in configs}
    for i in range(warmup + repeats):
        for name, cfg in configs.items():
            _sync(device)
            start = time.perf_counter()
            one_step(model, logp_fn, batch, cfg)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    plain = statistics.median(times["plain_ppo"])
    full = statistics.median(times["all_corrections"])
    return {"plain_ppo_ms": round(plain * 1e3, 3), "all_corrections_ms": round(full * 1e3, 3),
            "ratio": round(full / plain, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {"device": args.device, "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
               "batch": {"N": N, "prompt": PROMPT, "T": T, "V": V, "group": GROUP}}
    transformer = TinyCausalLM().to(args.device)
    batch = make_batch(args.device, response_logp, transformer)
    results["transformer"] = time_pair(transformer, response_logp, batch, args.warmup, args.repeats, args.device)
    head = LinearHead().to(args.device)
    batch = make_batch(args.device, linear_logp, head)
    results["linear_head"] = time_pair(head, linear_logp, batch, args.warmup, args.repeats, args.device)
    results["target_ratio"] = 1.15
    results["meets_target"] = results["transformer"]["ratio"] <= 1.15
    tr = results["transformer"]
    emit("learner_step", {"bench": "learner_step", **results},
         {"plain PPO": tr["plain_ppo_ms"], "all corrections": tr["all_corrections_ms"]},
         "ms per step (demo-shaped model)", f"learner step, all corrections vs plain PPO (ratio {tr['ratio']:.2f})")


if __name__ == "__main__":
    main()
