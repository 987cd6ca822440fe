"""LoRA adapters across the system: what an adapter is on the wire (`spec`), how a receiver checks and applies
one (`merge`, `merged`), the checksum every side computes over it (`checksum`), its files in peft's format
(`files`), and which adapter versions a vLLM engine keeps loaded (`versions`). The learner's side (peft) is
`asyncrl.learner.adapters`."""
