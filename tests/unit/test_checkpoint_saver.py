"""Checkpoints written in the background (`learner.checkpoint.background`): the checkpoint holds the state at
the step it was asked for, whatever training does meanwhile; the entries it covers are acknowledged only once
it is on disk; saves go one at a time; a failed write raises in the loop; the stall is the copy only. A
checkpoint names the entries it covers, so a learner that died between its rename and the acknowledgement
leaves nothing to be trained twice."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.core.buffer.memory import MemoryBuffer
from asyncrl.core.runtime.events import MemoryEvents
from asyncrl.learner.checkpoint import Checkpointer, load_checkpoint
from asyncrl.learner.checkpoint_index import (
    CheckpointMeta,
    Covered,
    ack_covered,
    list_checkpoints,
    read_covered,
)
from asyncrl.learner.checkpoint_saver import CheckpointSaver
from asyncrl.learner.learner_metrics import LearnerMetrics
from tests.unit.test_checkpoint import learner_model, logp, train_a_little
from tests.unit.test_learner_loop import group


def checkpointer_for(tiny_model_dir, tmp_path) -> Checkpointer:
    config = tiny_model_dir.config.model_copy(deep=True)
    config.run_dir = str(tmp_path / "run")
    return Checkpointer(config, AutoTokenizer.from_pretrained(str(tiny_model_dir.policy)))


class GatedWrites(Checkpointer):
    """Writes wait for `gate`; `started` is set as each write begins."""

    def __init__(self, inner: Checkpointer):
        self.__dict__.update(inner.__dict__)
        self.gate, self.started, self.writes = threading.Event(), threading.Event(), []

    def write(self, staged):
        self.started.set()
        assert self.gate.wait(30)
        self.writes.append(staged.meta.step)
        return super().write(staged)


def pending_entries(buffer: MemoryBuffer, n: int) -> list[str]:
    for i in range(n):
        buffer.put(group(f"g{i}"))
    return [e.entry_id for e in buffer.get(n, timeout_s=1.0)]


def test_a_staged_checkpoint_holds_the_state_of_its_step_while_training_goes_on(tiny_model_dir, tmp_path):
    checkpointer = checkpointer_for(tiny_model_dir, tmp_path)
    model, optimizer = learner_model(tiny_model_dir.policy)
    train_a_little(model, optimizer)
    at_stage = logp(model).detach()
    staged = checkpointer.stage(model, optimizer, CheckpointMeta(3, 3, 17, 0.0))
    train_a_little(model, optimizer, 2)  # the live parameters and optimizer moments change under the copy
    assert not torch.allclose(logp(model).detach(), at_stage)
    path = checkpointer.write(staged)

    exported = AutoModelForCausalLM.from_pretrained(str(path / "hf"), dtype=torch.float32).eval()
    assert torch.equal(logp(exported).detach(), at_stage)
    restored, restored_opt = learner_model(tiny_model_dir.policy)
    assert load_checkpoint(path, restored, restored_opt).step == 3
    assert torch.equal(logp(restored).detach(), at_stage)
    # The optimizer state is the staged one too: from the checkpoint, one step matches the same step taken
    # from a model trained to step 3 and saved in line.
    reference, reference_opt = learner_model(tiny_model_dir.policy)
    train_a_little(reference, reference_opt)
    train_a_little(reference, reference_opt, 1)
    train_a_little(restored, restored_opt, 1)
    assert torch.allclose(logp(restored).detach(), logp(reference).detach(), atol=1e-6, rtol=0)


def test_entries_are_acknowledged_only_once_their_background_checkpoint_is_on_disk(tiny_model_dir, tmp_path):
    checkpointer = GatedWrites(checkpointer_for(tiny_model_dir, tmp_path))
    buffer, events, metrics = MemoryBuffer(), MemoryEvents(), LearnerMetrics()
    saver = CheckpointSaver(checkpointer, buffer, events, metrics, background=True)
    model, optimizer = learner_model(tiny_model_dir.policy)
    covered = pending_entries(buffer, 3)

    stall_s = saver.save(model, optimizer, CheckpointMeta(10, 10, 0, 0.0), covered)
    assert checkpointer.started.wait(10)
    saver.poll()  # still writing: nothing to raise, nothing acknowledged, no checkpoint in place
    assert buffer.pending() == 3 and list_checkpoints(checkpointer.config.run_dir) == []
    assert events.of_kind("checkpoint_saved") == []

    checkpointer.gate.set()
    saver.wait()
    assert buffer.pending() == 0
    [saved] = events.of_kind("checkpoint_saved")
    assert (saved["step"], saved["acked"], saved["background"], saved["stall_s"]) == (10, 3, True, stall_s)
    assert saved["seconds"] > stall_s
    assert [p.name for p in list_checkpoints(checkpointer.config.run_dir)] == ["step-000010"]
    assert metrics.checkpoint_stall_seconds._sum.get() == pytest.approx(stall_s)


def test_one_background_save_at_a_time(tiny_model_dir, tmp_path):
    checkpointer = GatedWrites(checkpointer_for(tiny_model_dir, tmp_path))
    buffer, events = MemoryBuffer(), MemoryEvents()
    saver = CheckpointSaver(checkpointer, buffer, events, LearnerMetrics(), background=True)
    model, optimizer = learner_model(tiny_model_dir.policy)
    saver.save(model, optimizer, CheckpointMeta(10, 10, 0, 0.0), pending_entries(buffer, 2))
    assert checkpointer.started.wait(10)
    release = threading.Timer(0.5, checkpointer.gate.set)
    release.start()
    t0 = time.perf_counter()
    second_stall = saver.save(model, optimizer, CheckpointMeta(20, 20, 0, 0.0), [])
    assert time.perf_counter() - t0 >= 0.4 and second_stall >= 0.4  # it waited for the first write
    saver.wait()
    assert checkpointer.writes == [10, 20]
    assert [e["step"] for e in events.of_kind("checkpoint_saved")] == [10, 20]


def test_a_failed_background_write_raises_in_the_loop_and_acknowledges_nothing(tiny_model_dir, tmp_path):
    class FailingWrites(Checkpointer):
        def write(self, staged):
            raise OSError(28, "No space left on device")

    inner = checkpointer_for(tiny_model_dir, tmp_path)
    checkpointer = FailingWrites(inner.config, inner.tokenizer)
    buffer = MemoryBuffer()
    saver = CheckpointSaver(checkpointer, buffer, MemoryEvents(), LearnerMetrics(), background=True)
    model, optimizer = learner_model(tiny_model_dir.policy)
    saver.save(model, optimizer, CheckpointMeta(10, 10, 0, 0.0), pending_entries(buffer, 2))
    deadline = time.monotonic() + 10
    with pytest.raises(OSError, match="No space left"):
        while time.monotonic() < deadline:
            saver.poll()
            time.sleep(0.01)
    assert buffer.pending() == 2  # trained again from the checkpoint before, if the learner restarts
    saver.poll()  # raised once


def test_in_line_saves_stall_for_the_whole_save(tiny_model_dir, tmp_path):
    buffer, events = MemoryBuffer(), MemoryEvents()
    saver = CheckpointSaver(checkpointer_for(tiny_model_dir, tmp_path), buffer, events, LearnerMetrics(),
                            background=False)
    model, optimizer = learner_model(tiny_model_dir.policy)
    stall_s = saver.save(model, optimizer, CheckpointMeta(10, 10, 0, 0.0), pending_entries(buffer, 2))
    [saved] = events.of_kind("checkpoint_saved")
    assert buffer.pending() == 0 and saved["background"] is False and saved["seconds"] == saved["stall_s"] == stall_s


class AcksFail(MemoryBuffer):
    """A buffer whose acknowledgements fail while `down` (Redis gone for the ack: the learner's loop dies, as a
    learner killed right after the rename would)."""

    down = True

    def ack(self, entry_ids):
        if self.down:
            raise ConnectionError("simulated: Redis unreachable for the acknowledgement")
        return super().ack(entry_ids)


@pytest.mark.parametrize("background", [False, True])
def test_a_checkpoint_whose_learner_died_before_acknowledging_is_not_trained_twice(tiny_model_dir, tmp_path,
                                                                                   background):
    checkpointer = checkpointer_for(tiny_model_dir, tmp_path)
    buffer, events = AcksFail(), MemoryEvents()
    saver = CheckpointSaver(checkpointer, buffer, events, LearnerMetrics(), background=background)
    model, optimizer = learner_model(tiny_model_dir.policy)
    covered = pending_entries(buffer, 3)
    read_ahead = pending_entries(buffer, 2)  # delivered, not yet trained: no part of the checkpoint
    with pytest.raises(ConnectionError, match="simulated"):
        saver.save(model, optimizer, CheckpointMeta(10, 10, 0, 0.0), covered, ["g0", "g1", "g2"])
        saver.wait()
    [path] = list_checkpoints(checkpointer.config.run_dir)  # in place, its entries still pending
    assert read_covered(path) == Covered(tuple(covered), ("g0", "g1", "g2")) and buffer.pending() == 5
    assert events.of_kind("checkpoint_saved") == []

    buffer.down = False  # whoever continues from the checkpoint, once Redis answers
    assert ack_covered(buffer, path, events) == read_covered(path)
    assert sorted(e.entry_id for e in buffer.all_pending()) == sorted(read_ahead)  # trained from the checkpoint
    [record] = events.of_kind("covered_acked")
    assert (record["acked"], record["covered"]) == (3, 3)
    ack_covered(buffer, path, events)  # again: nothing left to acknowledge, nothing recorded
    assert len(events.of_kind("covered_acked")) == 1


def test_a_checkpoint_written_before_checkpoints_named_their_entries_covers_none(tmp_path):
    assert read_covered(tmp_path) == Covered() == ack_covered(MemoryBuffer(), tmp_path, MemoryEvents())
