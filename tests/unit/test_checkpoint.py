"""Learner checkpoints: the Hugging Face export and the DCP state restore the same policy; pruning; atomicity."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.core.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.learner.checkpoint import (
    Checkpointer,
    CheckpointMeta,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_meta,
)
from asyncrl.push.transport.flat import bind_parameters

SEQUENCES, STARTS = [[1, 5, 6, 14, 7, 8, 15, 9, 2], [1, 9, 14, 9, 15, 5, 12, 2]], [7, 6]


def learner_model(path):
    # As the learner holds it: parameters in shared bucket storage (the zero-copy push layout).
    model = load_causal_lm(path)
    bind_parameters(model, named_weights(model), 1 << 16)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def logp(model):
    return sequence_logprobs(model, SEQUENCES, STARTS, None, pad_id=0)[0]


def train_a_little(model, optimizer, steps=3):
    for _ in range(steps):
        loss = -logp(model).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_export_and_state_restore_the_trained_policy(tiny_model_dir, tmp_path):
    config = tiny_model_dir.config.model_copy(deep=True)
    config.run_dir = str(tmp_path / "run")
    config.learner.checkpoint.keep_last = 2
    model, optimizer = learner_model(tiny_model_dir.policy)
    base = logp(model).detach()
    train_a_little(model, optimizer)
    trained = logp(model).detach()
    assert not torch.allclose(base, trained)
    checkpointer = Checkpointer(config, AutoTokenizer.from_pretrained(str(tiny_model_dir.policy)))
    path = checkpointer.save(model, optimizer, CheckpointMeta(3, 3, 17, 0.0))

    exported = AutoModelForCausalLM.from_pretrained(str(path / "hf"), dtype=torch.float32).eval()
    assert torch.equal(logp(exported).detach(), trained)  # bit-identical: float32 copies of the same tensors
    assert AutoTokenizer.from_pretrained(str(path / "hf"))("12+34=").input_ids == [1, 5, 6, 14, 7, 8, 15]

    restored, restored_opt = learner_model(tiny_model_dir.policy)
    meta = load_checkpoint(path, restored, restored_opt)
    assert meta == read_meta(path) and (meta.step, meta.version, meta.data_position) == (3, 3, 17)
    assert torch.equal(logp(restored).detach(), trained)
    # The optimizer state came back too: one more step from both gives the same weights.
    train_a_little(model, optimizer, 1)
    train_a_little(restored, restored_opt, 1)
    assert torch.allclose(logp(restored).detach(), logp(model).detach(), atol=1e-6, rtol=0)


def test_keep_last_and_half_written_checkpoints(tiny_model_dir, tmp_path):
    config = tiny_model_dir.config.model_copy(deep=True)
    config.run_dir = str(tmp_path / "run")
    config.learner.checkpoint.keep_last = 2
    config.learner.checkpoint.export_hf = False
    model, optimizer = learner_model(tiny_model_dir.policy)
    checkpointer = Checkpointer(config, AutoTokenizer.from_pretrained(str(tiny_model_dir.policy)))
    for step in (10, 20, 30):
        checkpointer.save(model, optimizer, CheckpointMeta(step, step, 0, 0.0))
    assert [p.name for p in list_checkpoints(config.run_dir)] == ["step-000020", "step-000030"]
    # A save that died half-way leaves only its temporary directory: never taken for a checkpoint.
    (tmp_path / "run" / "checkpoints" / ".step-000040.tmp" / "learner").mkdir(parents=True)
    assert latest_checkpoint(config.run_dir).name == "step-000030"

