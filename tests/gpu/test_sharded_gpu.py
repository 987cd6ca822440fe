"""The sharded learner on GPUs: two ranks over NCCL (one GPU each) train the same weights as one rank on
one GPU, and bf16 mixed precision trains finite weights. The CPU tier (tests/integration/
test_sharded_learner.py, gloo) covers the same code on CPUs."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.tools.processes import free_port
from tests.integration.test_sharded_learner import LEARNER, full_state, max_difference, one_rank

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two ranks over NCCL need two CUDA GPUs"),
]

TOLERANCE = 1e-4  # float32 on GPU kernels: other reduction orders per batch shape than one rank's


def _rank(rank: int, port: int, model_path: str, learner: dict, mixed_precision: str, out: str) -> None:
    import os

    import torch.distributed as dist

    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.learner.sharding import Mirror, Ranks, leave, shard, train_step
    from tests.integration.test_sharded_learner import batches, trainer_for

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    ranks = Ranks(rank, 2, f"cuda:{rank}")
    model = load_causal_lm(model_path, "float32", f"cuda:{rank}")
    mirror = Mirror.before_sharding(model, ranks)
    shard(model, mixed_precision, False)
    trainer = trainer_for(model, learner, ranks)
    for step, b in enumerate(batches()):
        metrics = train_step(trainer, b, step, mirror)
        assert metrics["weights/finite"] == 1.0
    if ranks.leader:
        torch.save({k: v.cpu() for k, v in full_state(mirror.module).items()}, f"{out}/weights.pt")
    leave(ranks)  # on success only: a failing rank exits, and spawn stops the other
    os._exit(0)  # as `asyncrl learner` ends a rank: no interpreter teardown beside the group's threads


@pytest.mark.parametrize("mixed_precision", ["none", "bf16"])
def test_two_gpu_ranks(tmp_path, tiny_model_dir, mixed_precision):
    learner = {**LEARNER, "device": "cuda", "world_size": 2, "mixed_precision": mixed_precision}
    mp.spawn(_rank, args=(free_port("127.0.0.1"), str(tiny_model_dir.policy), learner, mixed_precision,
                          str(tmp_path)), nprocs=2, join=True)
    sharded = torch.load(tmp_path / "weights.pt")
    if mixed_precision == "none":
        reference, _ = one_rank(tiny_model_dir.policy, {**LEARNER, "device": "cuda"}, on="cuda:0")
        reference = {k: v.cpu() for k, v in reference.items()}
        difference = max_difference(sharded, reference)
        print(f"two NCCL ranks vs one GPU: max |delta weight| {difference:.2e}")
        assert difference < TOLERANCE
    else:
        assert all(torch.isfinite(v).all() for v in sharded.values())
