"""The learner's objective family as pure functions on tensors (see docs/algorithms.md)."""
