"""asyncrl: asynchronous RL post-training of language models (shared code: config, contracts, buffer,
weight transport, tasks, launcher)."""

__version__ = "0.1.0"
