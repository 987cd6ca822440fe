"""Weight push data plane: plans, bucketing, and the gloo / nccl transports."""
