"""Determinism: batch-invariant forwards (bitwise on-policy) and seeded sampling (reproducible runs).

`modes` names the levels (`model.determinism`), `invariant_ops` holds the batch-invariant computations,
`invariant_model` puts a model on them, `seeds` derives each sample's sampling seed from what is sampled.
docs/determinism.md tells the whole story.
"""
