"""Evaluation estimators (seed: off-policy blog, "Computing Pass@k")."""

from __future__ import annotations


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
