"""Evaluation estimators (seed: "What's in Pass@K?"): the unbiased pass@k from n >= k samples, the Bernoulli
extrapolation to any k from the pass rate, and the Beta-binomial model of the pass rates across prompts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Evaluated as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which equals the binomial ratio but never forms huge
    binomials. Sampling only k responses and reporting c/k is the biased mistake the seed warns about.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def bernoulli_pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k extrapolated from the pass rate p = c/n: 1 - (1 - p)^k, for any k (also k > n). Biased for one
    prompt, but it ranks checkpoints as the unbiased estimator does, and needs no n >= k (the seed's
    checkpoint-selection recipe)."""
    if n < 1 or not 0 <= c <= n or k < 1:
        raise ValueError(f"bernoulli_pass_at_k needs n >= 1, 0 <= c <= n and k >= 1; got n={n}, c={c}, k={k}")
    return 1.0 - (1.0 - c / n) ** k


@dataclass(frozen=True)
class BetaFit:
    """A Beta(alpha, beta) distribution of per-prompt pass rates (`fit_beta_binomial`)."""

    alpha: float
    beta: float

    def pass_at_k(self, k: int) -> float:
        """Expected pass@k over the prompts: 1 - E[(1 - p)^k] = 1 - B(alpha, beta + k) / B(alpha, beta)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        a, b = self.alpha, self.beta
        log_miss = math.lgamma(b + k) + math.lgamma(a + b) - math.lgamma(a + b + k) - math.lgamma(b)
        return 1.0 - math.exp(log_miss)

    def log_likelihood(self, successes, trials) -> float:
        """Beta-binomial log-likelihood of (successes, trials) per prompt (without the binomial coefficients,
        which do not depend on the parameters)."""
        c, n = _counts(successes, trials)
        return float(_log_likelihood(torch.tensor(math.log(self.alpha), dtype=torch.float64),
                                     torch.tensor(math.log(self.beta), dtype=torch.float64), c, n))


LOG_PARAM_BOUND = 12.0
"""|log alpha|, |log beta| are kept within this: a set where every prompt is always (never) solved drives the
maximum likelihood to the boundary, and exp(±12) is as good as 0 or infinity for any pass@k."""


def _counts(successes, trials) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.as_tensor(successes, dtype=torch.float64).flatten()
    n = torch.as_tensor(trials, dtype=torch.float64).flatten()
    if c.numel() == 0 or c.shape != n.shape or bool((n < 1).any()) or bool(((c < 0) | (c > n)).any()):
        raise ValueError("fit_beta_binomial needs one (successes, trials) per prompt, trials >= 1 and "
                         "0 <= successes <= trials")
    return c, n


def _log_likelihood(log_a: torch.Tensor, log_b: torch.Tensor, c: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    a, b = log_a.exp(), log_b.exp()
    log_beta = lambda x, y: torch.lgamma(x) + torch.lgamma(y) - torch.lgamma(x + y)
    return (log_beta(c + a, n - c + b) - log_beta(a, b)).sum()


def fit_beta_binomial(successes, trials, steps: int = 200) -> BetaFit:
    """Maximum-likelihood Beta(alpha, beta) of the pass rates behind (successes_i, trials_i) per prompt (the
    seed's Beta-binomial difficulty model, Kazdan et al.): pass@k for any k follows from it (`BetaFit.pass_at_k`)
    without sampling k per prompt, and prompts with different trials (dynamic N) weigh as their counts say.
    Started from the method of moments on c/n, then L-BFGS over (log alpha, log beta)."""
    c, n = _counts(successes, trials)
    p = c / n
    mean = float(p.mean().clamp(1e-3, 1 - 1e-3))
    var = float(p.var(unbiased=False)) if p.numel() > 1 else 0.0
    total = mean * (1 - mean) / var - 1 if var > 0 else 100.0
    total = min(max(total, 0.1), 1e4)
    params = torch.tensor([math.log(mean * total), math.log((1 - mean) * total)], dtype=torch.float64,
                          requires_grad=True)
    optimizer = torch.optim.LBFGS([params], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        bounded = params.clamp(-LOG_PARAM_BOUND, LOG_PARAM_BOUND)
        loss = -_log_likelihood(bounded[0], bounded[1], c, n) / c.numel()
        loss.backward()
        return loss

    optimizer.step(closure)
    log_a, log_b = params.detach().clamp(-LOG_PARAM_BOUND, LOG_PARAM_BOUND).tolist()
    return BetaFit(alpha=math.exp(log_a), beta=math.exp(log_b))


def pass_at_k_scores(solved: list[int], drawn: list[int], k: int, large_k: int = 0) -> dict[str, float]:
    """The held-out pass@k figures from each prompt's solved and drawn samples: the unbiased estimate
    ("pass@k", the mean over prompts), the Bernoulli extrapolation ("pass@k/bernoulli") and the Beta-binomial
    model's ("pass@k/beta_binomial"); with `large_k`, the two extrapolations to it as well (checkpoint
    selection needs the ranking at large k, not the exact value)."""
    fit = fit_beta_binomial(solved, drawn)
    mean = lambda values: sum(values) / len(values)
    scores = {f"pass@{k}": mean([pass_at_k(n, c, k) for c, n in zip(solved, drawn)])}
    for kk in (k, large_k) if large_k else (k,):
        scores[f"pass@{kk}/bernoulli"] = mean([bernoulli_pass_at_k(n, c, kk) for c, n in zip(solved, drawn)])
        scores[f"pass@{kk}/beta_binomial"] = fit.pass_at_k(kk)
    return scores
