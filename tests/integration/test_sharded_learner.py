"""The learner over two ranks (FSDP2, gloo, two processes) against one rank, on the same batches:

- after several steps the weights agree within float tolerance. Why not bit for bit: each rank forwards
  its own rows (other batch shapes, other summation orders in the matmuls, ~1e-7 relative), and the
  gradients are summed across ranks in another order than one rank sums them. AdamW normalises each update
  by its running RMS, so tiny gradient differences stay tiny in the weights. Measured: after 3 steps at lr
  1e-3 the weights moved up to 6e-3 and the two runs differ by at most 1.2e-6 on an AVX-512 machine and
  1.6e-5 on an AVX2 one (its narrower vectors sum in another order), micro-batches with recomputed
  activations likewise. The tolerance is 5e-5, under 1% of the move: a share weighted wrongly turns the
  update itself, which AdamW makes of order lr = 1e-3 per step.
  The keys' biases are left out of the comparison: their gradient is zero in exact arithmetic (adding one
  vector to every key adds the same q·b to all of a query's scores, and softmax ignores a shift), so what
  they get is rounding noise, which AdamW's normalisation turns into steps of up to lr in any direction;
- micro-batching by a token budget gives the same step as the whole mini-batch at once;
- each rank holds about half the parameter, gradient and optimizer bytes;
- a checkpoint saved by two ranks resumes on one, and one saved by one resumes on two;
- a checkpoint staged by two ranks and written on their checkpoint threads while the next step trains holds
  the weights of its step, and the training is the same as without it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.core.config.schema import LearnerConfig, SamplingConfig
from asyncrl.core.model.modeling import load_causal_lm, named_weights
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.tools.processes import free_port
from tests.unit.test_trainer import batch as make_batch

pytestmark = pytest.mark.integration

STEPS = 3
LEARNER = {"lr": 1e-3, "minibatches": 2, "algo": {"preset": "decoupled_token_is"}}
TOLERANCE = 5e-5


def batches() -> list:
    """Batches of 4 groups with responses of uneven length (the denominators differ between the ranks'
    shares), different each step."""
    out = []
    for step in range(STEPS):
        b = make_batch(groups=4, group_size=4, width=4)
        g = torch.Generator().manual_seed(step + 1)
        b.rewards = torch.rand(len(b), generator=g).round()
        b.logp_behav = b.logp_behav * (1 + 0.1 * step)
        out.append(b)
    return out


def trainer_for(model, learner: dict, ranks=None):
    from asyncrl.learner.sharding import SINGLE
    from asyncrl.learner.trainer import Trainer

    cfg = LearnerConfig.model_validate(learner)
    return Trainer(model, cfg, SamplingParams.from_config(SamplingConfig()), pad_id=0, ranks=ranks or SINGLE)


def with_adapters(model, learner: dict) -> None:
    """LoRA adapters in `model` when `learner` asks for them (the same initial A on every rank: seeded)."""
    cfg = LearnerConfig.model_validate(learner)
    if cfg.lora.enabled:
        from asyncrl.learner.adapters import inject_adapters

        torch.manual_seed(0)
        inject_adapters(model, cfg.lora)


def full_state(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in named_weights(model)}


# Parameters whose gradient is zero in exact arithmetic (see the module's docstring): AdamW moves them by noise.
ZERO_GRADIENT = (".self_attn.k_proj.bias",)


def max_difference(a: dict, b: dict, ignore: tuple[str, ...] = ZERO_GRADIENT) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a if not k.endswith(ignore))


def one_rank(model_path: Path, learner: dict, steps: int = STEPS, start=None, on: str = "cpu") -> tuple[dict, object]:
    from asyncrl.learner.sharding import train_step

    model = load_causal_lm(model_path, "float32", on)
    with_adapters(model, learner)
    trainer = trainer_for(model, learner)
    if start is not None:
        start(model, trainer)
    for step, b in enumerate(batches()[:steps]):
        train_step(trainer, b, step, None)
    return full_state(model), trainer


def _rank_main(rank: int, world: int, port: int, model_path: str, learner: dict, out: str, job: dict) -> None:
    """One rank of a two-rank learner: shard, train, report weights (leader), bytes, and save or load."""
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    from asyncrl.learner.checkpoint import load_shards, save_shards, stage_shards
    from asyncrl.learner.sharding import Mirror, Ranks, leave, local_state_bytes, shard, train_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ranks = Ranks(rank, world, checkpoint_group=dist.new_group(backend="gloo"))
    writing = None
    model = load_causal_lm(model_path)
    with_adapters(model, learner)
    mirror = Mirror.before_sharding(model, ranks)
    shard(model, "none", False)
    trainer = trainer_for(model, learner, ranks)
    if job.get("load"):
        load_shards(job["load"], model, trainer.optimizer)
    for step, b in enumerate(batches()[job.get("first", 0) : job.get("last", STEPS)], start=job.get("first", 0)):
        if step == job.get("stage_at"):  # as `FollowerSaves.stage` and the leader's `Checkpointer.stage` do
            writing = ThreadPoolExecutor(1).submit(_write_later, job["stage_to"], stage_shards(model, trainer.optimizer),
                                                   ranks)
        train_step(trainer, b, step, mirror)
    if writing is not None:
        writing.result()
    if job.get("save"):
        save_shards(job["save"], model, trainer.optimizer)
    Path(out, f"bytes-{rank}.json").write_text(json.dumps(local_state_bytes(model, trainer.optimizer)))
    mirror.refresh(model)
    if ranks.leader:
        torch.save(full_state(mirror.module), Path(out, "weights.pt"))
    leave(ranks)  # on success only: a failing rank exits, and spawn stops the other
    os._exit(0)  # as `asyncrl learner` ends a rank: no interpreter teardown beside the group's threads


def _write_later(path: str, state: dict, ranks) -> None:
    """`write_shards` once the step after the copy has changed the live weights: the copy must not follow them."""
    from asyncrl.learner.checkpoint import write_shards

    time.sleep(1.0)
    write_shards(path, state, ranks)


def two_ranks(tmp_path: Path, model_path: Path, learner: dict, **job) -> dict:
    mp.spawn(_rank_main, args=(2, free_port("127.0.0.1"), str(model_path), learner, str(tmp_path), job), nprocs=2,
             join=True)
    return torch.load(tmp_path / "weights.pt")


def test_two_ranks_train_the_same_weights_as_one(tmp_path, tiny_model_dir):
    reference, trainer = one_rank(tiny_model_dir.policy, LEARNER)
    sharded = two_ranks(tmp_path, tiny_model_dir.policy, LEARNER)
    start = full_state(load_causal_lm(tiny_model_dir.policy))
    moved = max_difference(reference, start)
    assert moved > 1e-3  # the steps did move the weights
    assert max_difference(sharded, reference) < TOLERANCE, (max_difference(sharded, reference), moved)
    # Memory: each rank holds about half of the parameters, gradients and optimizer state of one rank.
    from asyncrl.learner.sharding import local_state_bytes

    single = local_state_bytes(trainer.model, trainer.optimizer)
    for rank in range(2):
        per_rank = json.loads((tmp_path / f"bytes-{rank}.json").read_text())
        for kind in ("parameters", "optimizer"):
            assert 0.45 < per_rank[kind] / single[kind] < 0.6, (kind, per_rank, single)


def test_two_ranks_train_the_same_lora_adapters_as_one(tmp_path, tiny_model_dir):
    """FSDP2 over a policy with LoRA adapters (frozen base, trained adapters): the adapters the two ranks train
    are the one rank's, the base never moves, and the leader's mirror refreshes the adapters only."""
    learner = {**LEARNER, "lora": {"enabled": True, "rank": 4, "alpha": 8.0}}
    reference, trainer = one_rank(tiny_model_dir.policy, learner)
    sharded = two_ranks(tmp_path, tiny_model_dir.policy, learner)
    adapters = [k for k in reference if ".lora_" in k]
    assert adapters and max(reference[k].abs().max().item() for k in adapters if ".lora_B." in k) > 1e-3
    assert max_difference(sharded, reference) < TOLERANCE
    start = full_state(load_causal_lm(tiny_model_dir.policy))
    base = {k.replace(".base_layer.", "."): v for k, v in sharded.items() if ".lora_" not in k}
    assert max_difference(base, start, ignore=()) == 0.0
    # Each rank holds about half of what trains: the adapters' optimizer state.
    from asyncrl.learner.sharding import local_state_bytes

    single = local_state_bytes(trainer.model, trainer.optimizer)
    for rank in range(2):
        per_rank = json.loads((tmp_path / f"bytes-{rank}.json").read_text())
        assert 0.4 < per_rank["optimizer"] / single["optimizer"] < 0.65, (per_rank, single)


def test_micro_batches_and_activation_checkpointing_give_the_same_step(tiny_model_dir):
    whole, _ = one_rank(tiny_model_dir.policy, LEARNER)
    parts, trainer = one_rank(tiny_model_dir.policy, {**LEARNER, "microbatch_tokens": 16})
    assert trainer.in_parts
    assert max_difference(whole, parts) < TOLERANCE

    def recompute(model, _trainer):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    recomputed, trainer = one_rank(tiny_model_dir.policy, {**LEARNER, "microbatch_tokens": 16}, start=recompute)
    assert trainer.model.is_gradient_checkpointing
    assert max_difference(whole, recomputed) < TOLERANCE


def test_a_checkpoint_of_two_ranks_resumes_on_one_and_back(tmp_path, tiny_model_dir):
    from asyncrl.learner.checkpoint import load_shards, save_shards

    reference, _ = one_rank(tiny_model_dir.policy, LEARNER)
    # Two ranks train steps 0-1 and save; one rank resumes and trains step 2.
    saved_by_two = tmp_path / "by-two"
    (tmp_path / "a").mkdir()
    two_ranks(tmp_path / "a", tiny_model_dir.policy, LEARNER, last=2, save=str(saved_by_two))

    def resume(model, trainer):
        load_shards(str(saved_by_two), model, trainer.optimizer)

    model = load_causal_lm(tiny_model_dir.policy)
    trainer = trainer_for(model, LEARNER)
    resume(model, trainer)
    from asyncrl.learner.sharding import train_step

    train_step(trainer, batches()[2], 2, None)
    assert max_difference(full_state(model), reference) < TOLERANCE

    # One rank trains steps 0-1 and saves; two ranks resume and train step 2.
    model = load_causal_lm(tiny_model_dir.policy)
    trainer = trainer_for(model, LEARNER)
    for step, b in enumerate(batches()[:2]):
        train_step(trainer, b, step, None)
    saved_by_one = tmp_path / "by-one"
    save_shards(str(saved_by_one), model, trainer.optimizer)
    (tmp_path / "b").mkdir()
    resumed = two_ranks(tmp_path / "b", tiny_model_dir.policy, LEARNER, load=str(saved_by_one), first=2)
    assert max_difference(resumed, reference) < TOLERANCE


def test_a_checkpoint_written_in_the_background_holds_its_step_while_the_next_trains(tmp_path, tiny_model_dir):
    """Both ranks copy their shards after step 1 and write them over the checkpoint group on a thread while
    step 2 trains over the default group: the checkpoint is step 1's, the training is undisturbed."""
    from asyncrl.learner.checkpoint import load_shards

    after_two, _ = one_rank(tiny_model_dir.policy, LEARNER, steps=2)
    after_three, _ = one_rank(tiny_model_dir.policy, LEARNER)
    staged = tmp_path / "staged"
    trained = two_ranks(tmp_path, tiny_model_dir.policy, LEARNER, stage_at=2, stage_to=str(staged))
    assert max_difference(trained, after_three) < TOLERANCE
    model = load_causal_lm(tiny_model_dir.policy)
    trainer = trainer_for(model, LEARNER)
    load_shards(str(staged), model, trainer.optimizer)
    assert max_difference(full_state(model), after_two) < TOLERANCE
    assert max_difference(after_three, after_two) > 1e-4  # step 2 moved the weights: the copy predates it


class _RunsCode:
    """A value whose unpickling runs code (it would create `target`)."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _broadcast_main(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from asyncrl.learner.sharding import Ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ranks = Ranks(rank=rank, world_size=2)
    batch = make_batch(groups=1, group_size=2, width=3)
    got = ranks.broadcast(("step", batch, 7) if rank == 0 else None)
    outcome = {"command": got[0], "version": got[2], "sequences": got[1].sequences,
               "same_logp": bool(torch.equal(got[1].logp_behav, batch.logp_behav))}
    try:
        ranks.broadcast(_RunsCode(str(Path(out) / "code-ran")) if rank == 0 else None)
        outcome["hostile"] = "taken"
    except Exception as err:  # noqa: BLE001 - the follower must refuse it
        outcome["hostile"] = type(err).__name__
    Path(out, f"rank{rank}.json").write_text(json.dumps(outcome))
    dist.destroy_process_group()


def test_what_the_leader_broadcasts_reaches_the_ranks_as_data_never_as_code(tmp_path):
    """Commands and batches reach every rank intact; bytes that would run code when unpickled are refused
    by the follower (the weights-only loader), and nothing runs."""
    mp.spawn(_broadcast_main, args=(free_port("127.0.0.1"), str(tmp_path)), nprocs=2, join=True)
    leader, follower = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert follower["command"] == "step" and follower["version"] == 7 and follower["same_logp"]
    assert follower["sequences"] == leader["sequences"]
    assert follower["hostile"] == "UnpicklingError" and leader["hostile"] == "taken"
    assert not (tmp_path / "code-ran").exists()
