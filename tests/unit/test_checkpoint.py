"""Learner checkpoints: the Hugging Face export and the DCP state restore the same policy; pruning; atomicity."""

from __future__ import annotations

import threading
import time
import weakref
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.learner import checkpoint
from asyncrl.learner.checkpoint import Checkpointer, load_checkpoint
from asyncrl.learner.checkpoint_index import CheckpointMeta, latest_checkpoint, list_checkpoints, read_meta
from asyncrl.push.flat import bind_parameters

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


class _Payload:
    """What a hostile checkpoint would hold: unpickling it runs code (here, it writes a file)."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_checkpoint_directory_never_runs_code_it_holds(tiny_model_dir, tmp_path):
    """Resuming reads every file of a checkpoint without unpickling arbitrary objects: a `rng.pt` replaced by
    a pickle that would run code is refused with a message naming the file, and runs nothing."""
    import pytest

    config = tiny_model_dir.config.model_copy(deep=True)
    config.run_dir = str(tmp_path / "run")
    config.learner.checkpoint.export_hf = False
    model, optimizer = learner_model(tiny_model_dir.policy)
    path = Checkpointer(config, AutoTokenizer.from_pretrained(str(tiny_model_dir.policy))).save(
        model, optimizer, CheckpointMeta(1, 1, 0, 0.0))
    restored, restored_opt = learner_model(tiny_model_dir.policy)
    load_checkpoint(path, restored, restored_opt)  # an honest one loads (RNG state included)
    ran = tmp_path / "code-ran"
    torch.save({"torch": torch.get_rng_state(), "numpy": _Payload(ran), "python": None}, path / "learner" / "rng.pt")
    with pytest.raises(ValueError, match="rng.pt"):
        load_checkpoint(path, restored, restored_opt)
    assert not ran.exists()


def test_the_export_of_a_model_with_tied_embeddings_holds_them_once(tmp_path):
    """`tie_word_embeddings`: the export writes the embedding once (no `lm_head.weight`), and transformers
    loads it tied, with the trained values."""
    from safetensors import safe_open
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.learner.checkpoint import export_hf

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    bind_parameters(model, named_weights(model), 1 << 16)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)

    class NoTokenizer:
        def save_pretrained(self, directory):
            pass

    export_hf(model, NoTokenizer(), tmp_path / "hf")
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(loaded.model.embed_tokens.weight, model.get_input_embeddings().weight)


def test_a_tensor_named_twice_is_staged_once_and_stays_one_tensor():
    """A tied embedding is two keys of the state dict: its host copy is made once (not twice the memory)."""
    import torch

    from asyncrl.learner.checkpoint import _host_copy

    shared, other = torch.ones(4, 3), torch.zeros(2)
    copied = _host_copy({"model": {"embed": shared, "lm_head": shared, "b": other}, "optim": [shared[1]]})
    model = copied["model"]
    assert model["embed"] is model["lm_head"] and model["embed"] is not shared
    assert torch.equal(model["embed"], shared) and model["b"] is not other
    assert copied["optim"][0] is not model["embed"] and torch.equal(copied["optim"][0], shared[1])  # a view: its own


def test_tensor_subclasses_are_staged_one_by_one():
    """A sharded learner's state is DTensors, whose data_ptr does not tell their shards apart: a tensor subclass
    is known by itself, so two of the same shape stay two copies (tests/integration/test_sharded_learner.py
    catches the DTensor case itself) and one named twice stays one."""
    import torch

    from asyncrl.learner.checkpoint import _host_copy

    class Wrapped(torch.Tensor):
        pass

    a, b = torch.ones(3).as_subclass(Wrapped), torch.zeros(3).as_subclass(Wrapped)
    copied = _host_copy({"a": a, "b": b, "a_again": a})
    assert torch.equal(copied["a"], torch.ones(3)) and torch.equal(copied["b"], torch.zeros(3))
    assert copied["a"] is copied["a_again"] and copied["a"] is not copied["b"]


def test_the_exports_of_runs_sharing_a_base_are_written_one_at_a_time(monkeypatch, tmp_path):
    """Each merged export holds a host copy of the whole policy while it is written: the runs' checkpoint
    writers (each on a thread of its own, `learner.runs`) take turns, so at most one copy exists."""
    in_flight, most, count = [0], [0], threading.Lock()

    def slow_export(module, tokenizer, directory, state):
        with count:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.1)
        with count:
            in_flight[0] -= 1

    monkeypatch.setattr(checkpoint, "export_hf", slow_export)
    config = SimpleNamespace(learner=SimpleNamespace(checkpoint=SimpleNamespace(export_hf=True)))
    writers = [threading.Thread(target=Checkpointer(config, None, run=f"run-{i}")._write_exports,
                                args=(None, tmp_path)) for i in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert most == [1]


def test_a_merged_export_is_freed_and_the_heap_trimmed_before_the_next_one(monkeypatch, tmp_path):
    """The merged copy is freed on the checkpoint thread that wrote it, where glibc would keep it in that
    thread's arena: once it is gone the heap is trimmed, before another run's export may start."""
    copies, trims = [], []

    def merged(module, spec, adapter):
        state = {"w": torch.zeros(4)}
        copies.append(weakref.ref(state["w"]))
        return state

    monkeypatch.setattr(checkpoint, "save_adapter", lambda *args: None)
    monkeypatch.setattr(checkpoint, "merged_state_dict", merged)
    monkeypatch.setattr(checkpoint, "export_hf", lambda module, tokenizer, directory, state: None)
    monkeypatch.setattr(checkpoint, "trim_heap", lambda: trims.append(
        (copies[-1]() is None, checkpoint._ONE_EXPORT_AT_A_TIME.locked())))
    config = SimpleNamespace(learner=SimpleNamespace(checkpoint=SimpleNamespace(export_hf=True)),
                             model=SimpleNamespace(path=""))
    Checkpointer(config, None, adapter=object(), run="run-0")._write_exports(None, tmp_path, {"a": torch.zeros(1)})
    assert trims == [(True, True)]
