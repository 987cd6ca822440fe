"""Multi-turn episodes (docs/agents.md): the environment seam, the built-in tool environment, how the chat
template's turns become tokens, the episode record and the runner that keeps many episodes in flight over one
engine. Used by the rollout replicas (training episodes), the evaluations (held-out success) and the tiny
model's warm start (reference episodes)."""
