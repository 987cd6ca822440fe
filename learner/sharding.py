"""A learner over N ranks: the policy sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`), gloo on
CPUs, NCCL on GPUs, one process per rank under `torchrun`.

Rank 0, the leader, runs the learner loop as one rank would: controller, buffer, teacher, event log,
metrics, weight push, evaluation, checkpoint metadata. The other ranks (followers) run `follow`: they wait
for the leader's commands and take part in what needs every rank, in the same order as the leader:

    STEP(batch, version)  -> `train_step`: the trainer's step on this rank's share (FSDP's all-gathers and
                             reduce-scatters, the loss denominators, the finite checks), then `Mirror.refresh`
    SAVE(path)            -> the sharded model and optimizer state into the checkpoint (torch.distributed.checkpoint)
    STAGE(path)           -> the same state copied to host memory now and written on the rank's checkpoint thread
                             while the next steps train (`learner.checkpoint.background`); the writes of all
                             ranks meet on a gloo group of their own (`Ranks.checkpoint_group`), apart from the
                             training's collectives
    STOP                  -> wait for that write, return

The leader keeps one full, unsharded copy of the weights, the `Mirror`: bucket-shaped storage (what the push
broadcasts without packing, `push.flat`) bound to an unsharded module (what evaluation and the Hugging
Face export read). After every step each rank gathers the full tensors one at a time in a fixed order
(`DTensor.full_tensor`), and the leader copies each into its bucket: no rank ever holds the model twice.
The replicas and the controller see one learner.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import types
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asyncrl.core.model.modeling import named_weights
from asyncrl.learner.batch import TrainBatch

log = logging.getLogger("asyncrl.learner")

STEP, SAVE, STAGE, STOP = "step", "save", "stage", "stop"


@dataclass(frozen=True)
class Ranks:
    """This process's place among the learner's ranks; with one rank every operation is the identity."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    """Where collective tensors live: the rank's GPU under NCCL, the CPU under gloo."""
    checkpoint_group: object = None
    """A gloo group of all ranks for checkpoints written in the background (None with one rank): their
    collectives run on the ranks' checkpoint threads while the training's run on the default group."""

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world_size > 1

    def broadcast(self, obj=None):
        """The leader's `obj` on every rank (commands and batches): written with `torch.save` and read back
        with the weights-only loader, which takes tensors, plain values and `TrainBatch` and nothing else, so
        bytes that reach a rank over the group can never make it run code (`broadcast_object_list` would
        unpickle anything)."""
        if not self.sharded:
            return obj
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        if self.leader:
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(self.device)
            size.fill_(data.numel())
        dist.broadcast(size, src=0)
        if not self.leader:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(data, src=0)
        if self.leader:
            return obj
        with torch.serialization.safe_globals([TrainBatch]):
            return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the ranks (a new tensor)."""
        if not self.sharded:
            return value
        out = value.detach().to(self.device).clone()
        dist.all_reduce(out)
        return out.to(value.device)

    def max(self, value: int) -> int:
        """The largest `value` over the ranks."""
        if not self.sharded:
            return value
        out = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return int(out.item())

    def all(self, flag: bool) -> bool:
        """True when `flag` holds on every rank."""
        if not self.sharded:
            return flag
        return int(self.sum(torch.tensor([int(not flag)], dtype=torch.int64)).item()) == 0

    def share(self, items: list) -> list:
        """This rank's items of a list every rank holds in the same order (round-robin)."""
        return items[self.rank :: self.world_size]


SINGLE = Ranks()


def init_ranks(world_size: int, device: str) -> Ranks:
    """Join the learner's process group when `world_size` > 1 (torchrun's RANK / WORLD_SIZE / MASTER_ADDR in
    the environment): NCCL when the learner runs on CUDA (one device per rank, LOCAL_RANK), gloo otherwise."""
    if world_size == 1:
        return SINGLE
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != world_size:
        raise RuntimeError(f"learner.world_size is {world_size} but this process was started as one of "
                           f"{launched} ranks (WORLD_SIZE); start it with `asyncrl learner`, which runs torchrun")
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), rank_device(device) if cuda else "cpu",
                 checkpoint_group=dist.new_group(backend="gloo"))


def rank_device(device: str) -> str:
    """The device of this rank: `cuda` means the local rank's GPU."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{os.environ['LOCAL_RANK']}"
    return device


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP2 shards one by one: the classes a Hugging Face model names in
    `_no_split_modules` (its decoder layers)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no transformer block class (_no_split_modules): "
                         "cannot shard it block by block")
    return blocks


def shard(model: torch.nn.Module, mixed_precision: str, activation_checkpointing: bool) -> None:
    """FSDP2 in place: every transformer block, then the root (embeddings, final norm, LM head, tied
    weights together). FSDP averages the gradients over the ranks; each rank's loss is its part of the whole
    mini-batch's (global denominators, `Trainer`), scaled by the number of ranks, so the average is the sum
    of the parts (a custom divide factor would need PREMUL_SUM, which gloo lacks)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in transformer_blocks(model):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    # The log-prob forward calls the base model and the LM head itself, not the root's forward: give it a
    # root method FSDP brackets like a forward (gather the root's weights, release them, hook the backward).
    model.run_in_root_forward = types.MethodType(_run_in_root_forward, model)
    register_fsdp_forward_method(model, "run_in_root_forward")


def _run_in_root_forward(self, fn, *args, **kwargs):
    return fn(self, *args, **kwargs)


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (its shards when sharded)."""

    def nbytes(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    params = list(model.parameters())
    return {
        "parameters": sum(nbytes(p) for p in params),
        "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(nbytes(v) for state in optimizer.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0),
    }


class Mirror:
    """The leader's full copy of a sharded policy: an unsharded module whose weights live in the weight
    push's bucket storage. `refresh` is collective (every rank calls it after every step)."""

    def __init__(self, unsharded: torch.nn.Module | None, trained_only: bool = False):
        self.module = unsharded
        """The leader's unsharded module (None on followers)."""
        self.trained_only = trained_only
        """Refresh only the parameters that train (LoRA: the adapters; the base never changes)."""

    @classmethod
    def before_sharding(cls, model: torch.nn.Module, ranks: Ranks) -> Mirror:
        trained_only = not all(p.requires_grad for p in model.parameters())
        copied = None
        if ranks.leader:
            copied = copy.deepcopy(model).eval()
            for mine, theirs in zip(copied.parameters(), model.parameters()):
                mine.requires_grad_(theirs.requires_grad)  # which are trained: named the same on both sides
        return cls(copied, trained_only)

    def _tensors(self, model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        if self.trained_only:
            return [(name, p.detach()) for name, p in model.named_parameters() if p.requires_grad]
        return named_weights(model)

    @torch.no_grad()
    def refresh(self, sharded: torch.nn.Module) -> None:
        """Gather every full tensor (the trained ones only, `trained_only`) in order (all ranks), into the
        leader's copy."""
        into = dict(self._tensors(self.module)) if self.module is not None else {}
        for name, tensor in self._tensors(sharded):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.module is not None:
                into[name].copy_(full)
            del full


def train_step(trainer, batch, version: int, mirror: Mirror | None) -> dict:
    """One step as every rank runs it (the order of collectives is the same on all): the trainer's step,
    the finite check of the new weights, the mirror's refresh."""
    metrics = trainer.step(batch, version)
    finite = trainer.weights_finite()
    if mirror is not None and finite:
        mirror.refresh(trainer.model)
    metrics["weights/finite"] = float(finite)
    return metrics


def follow(trainer, ranks: Ranks, mirror: Mirror, saves) -> None:
    """A follower's loop: run the leader's commands until STOP. `saves` writes this rank's part of each
    checkpoint: `save(path)` in line, `stage(path)` in the background, `wait()` for that write
    (`checkpoint_saver.FollowerSaves`)."""
    while True:
        command, *args = ranks.broadcast()
        if command == STEP:
            batch, version = args
            train_step(trainer, batch, version, mirror)
        elif command == SAVE:
            saves.save(*args)
        elif command == STAGE:
            saves.stage(*args)
        elif command == STOP:
            saves.wait()
            log.info("rank %d: stop", ranks.rank)
            return
        else:
            raise RuntimeError(f"rank {ranks.rank}: unknown command {command!r}")


def leave(ranks: Ranks) -> None:
    """Leave the process group together: a barrier first, so no rank tears its connections down while
    another still talks on them (gloo aborts the process that finds a peer gone)."""
    if ranks.sharded and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
