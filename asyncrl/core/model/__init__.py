"""Model computations every role shares: loading a causal LM, per-token log-probs, prompt sharing and packed rows, MoE routing, tokenizers and the sampling distribution."""
