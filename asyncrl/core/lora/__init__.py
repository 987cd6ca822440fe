"""LoRA adapters across the system: what an adapter is on the wire (`spec`), how a receiver checks and applies
one (`merge`, `merged`), several in one batch (`row_adapters`), its files in peft's format (`files`), and which
adapter versions a vLLM engine keeps loaded (`versions`). Its checksum is any push's
(`asyncrl.core.checks.weights_checksum`). The learner's side (peft) is `asyncrl.learner.adapters`."""
