"""The learner's main loop: collect B trajectories -> (teacher annotation) -> step -> ack -> push i+1, with
the next batch read, checked and assembled while this one trains (`learner.prefetch`, `learner/intake.py`)
and push i+1 sent from a snapshot while step i+1 trains (`learner.push_in_background`).

While it waits for data it heartbeats the controller and runs resync pushes for replicas that joined late
or restarted, so they can get leases (and produce the data the learner waits for).
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from asyncrl.core.buffer.trajectory_checks import TrajectoryLimits
from asyncrl.core.config.schema import LearnerConfig, TeacherConfig
from asyncrl.core.records.learner import (
    Eval,
    EvalFallback,
    EvalSkipped,
    FinalBuffer,
    LearnerStarted,
    MemoryMeasured,
    RecoveredPending,
    Resumed,
    Resync,
    Step,
    TeacherUnavailable,
    Trained,
    WeightsPushed,
)
from asyncrl.core.wire.teacher_client import score, score_request
from asyncrl.learner.busy import BusyMeter
from asyncrl.learner.checkpoint_index import CheckpointMeta, ack_covered
from asyncrl.learner.checkpoint_saver import CheckpointSaver
from asyncrl.learner.intake import BatchIntake
from asyncrl.learner.memory_plan import MemoryWatch
from asyncrl.learner.progress import LearnerProgress
from asyncrl.learner.quota_return import return_quota
from asyncrl.learner.replica_eval import BackgroundEvaluations
from asyncrl.learner.sharding import SINGLE, STEP, Mirror, Ranks, train_step
from asyncrl.learner.stale_hold import StaleHold
from asyncrl.learner.status_report import StatusReporter
from asyncrl.learner.timeline import rejoin
from asyncrl.v1 import controller_pb2

log = logging.getLogger("asyncrl.learner")


class LearnerLoop:
    def __init__(self, *, learner: LearnerConfig, groups_per_step: int, lookahead: int, trainer, buffer,
                 controller_stub, publisher, evaluate, events, metrics, limits: TrajectoryLimits, model_path: str = "",
                 teacher_stub=None, teacher: TeacherConfig | None = None, checkpointer=None, sinks=None,
                 ranks: Ranks = SINGLE, mirror: Mirror | None = None,
                 replica_evals: BackgroundEvaluations | None = None,
                 memory_watch: MemoryWatch | None = None, eta: int | None = None,
                 canonical_order: bool = False, on_base=None):  # fmt: skip
        """`groups_per_step`: B / G; `lookahead`: the groups held to choose each batch from (`lookahead_groups`);
        `model_path`: what a fresh start trains from (its `resumed` record); `teacher`: how `teacher_stub` is
        called (retries, time-outs); `eta`: the run's staleness bound, held at read too (`learner.stale_groups`);
        `canonical_order`: each batch in `intake.age` order (`model.determinism`); `on_base(fn, *args)`: how
        what runs the model is called (steps, checkpoints; `evaluate` takes it itself): where several runs
        share one base, on the base's own thread with this run's adapter active (`learner.runs`); None: here."""
        self.config = learner
        self.on_base = on_base or (lambda fn, *args: fn(*args))
        self.memory_watch = memory_watch
        """The memory check after the first step (`learner.memory_plan`); None: not checked, or done."""
        self.teacher_config = teacher or TeacherConfig()
        self.model_path = model_path
        self.trainer = trainer
        self.buffer = buffer
        self.stub = controller_stub
        self.publisher = publisher
        self.evaluate = evaluate
        self.events = events
        self.metrics = metrics
        self.teacher = teacher_stub
        self.saver = None if checkpointer is None else CheckpointSaver(checkpointer, buffer, events, metrics,
                                                                        learner.checkpoint.background)
        """Writes checkpoints with the `checkpointer` (`learner.checkpoint`) and acknowledges the entries each
        covers once it is on disk (`learner.checkpoint_saver`); None: never saves, acknowledges every step."""
        self.sinks = sinks
        """TensorBoard / W&B (`tracking`); None: the JSONL log only."""
        self._saved_step = -1
        self._unacked: list[str] = []
        """Entries trained since the last checkpoint: acknowledged once a checkpoint includes their step."""
        self._unacked_groups: list[str] = []
        """The groups of `_unacked` (named in the next checkpoint)."""
        self.resumed: CheckpointMeta | None = None
        """Set by `resume`: the checkpoint this learner continues from."""
        self.resumed_path: str | None = None
        """Where that checkpoint is (its covered entries are acknowledged before anything is read)."""
        self.groups_per_step = groups_per_step
        self.progress = LearnerProgress()
        self._last_step_end: float | None = None
        self.busy = BusyMeter()
        self.ranks = ranks
        """The learner's ranks: this loop runs on the leader and tells the others each step."""
        self.intake = BatchIntake(
            buffer=buffer, events=events, metrics=metrics, limits=limits, batch_size=learner.batch_size,
            groups_per_step=self.groups_per_step,
            batch_timeout_s=learner.batch_timeout_s, prefetch=learner.prefetch,
            routing_shape=lambda: self.trainer.replay.shape, version=lambda: self.progress.version,
            heartbeat=self._heartbeat, lookahead=lookahead, max_staleness=eta,
            return_quota=functools.partial(return_quota, controller_stub), stale_policy=learner.stale_groups,
            hold=StaleHold(controller_stub, eta, self._heartbeat, metrics)
            if learner.stale_groups == "hold" and eta is not None else None,
            canonical_order=canonical_order,
        )  # fmt: skip
        """The entries each batch is made of, admitted (or dead-lettered) and prefetched."""
        self.status = StatusReporter(controller_stub, learner.total_steps, self._observe_gauges,
                                     learner.status_interval_s)
        """The heartbeats with the learner's progress (`learner.status_report`)."""
        self.mirror = mirror
        """The leader's full copy of a sharded policy (None with one rank)."""
        self.replica_evals = replica_evals
        """The evaluations every `eval_every` steps on a replica (`learner.eval_by: replica`); None: in line."""

    # -- data -----------------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        """Tell the controller where the learner is while it waits for data; push the current version to
        lagging replicas when it asks."""
        if self.status.now(self.progress):
            self._resync()

    def _resync(self) -> None:
        self.finish_push()  # one push at a time; a resync re-sends the committed version
        result = self.publisher.push(self.progress.version)
        self.events.write(Resync(version=result.version, acked=result.acked, dropped=result.dropped,
                                 seconds=result.total_s))

    def _observe_gauges(self) -> None:
        self.metrics.observe_buffer(self.buffer.backlog(), self.buffer.pending())

    def annotate(self, batch) -> None:
        """Fill batch.logp_teacher from the teacher's Score RPC, retrying with backoff; a teacher that stays
        unreachable leaves it None (the step trains without the distillation term) and is recorded."""
        reply, error = score(self.teacher, score_request(batch.sequences, batch.response_starts), self.teacher_config)
        if reply is None:
            batch.logp_teacher = None
            self.metrics.teacher_failures.inc()
            self.events.write(TeacherUnavailable(step=self.progress.step, error=error))
            return
        width = batch.response_mask.shape[1]
        logp_teacher = torch.zeros_like(batch.logp_behav)
        for row, scored in enumerate(reply.sequences):
            values = list(scored.logp_teacher)[:width]
            logp_teacher[row, : len(values)] = torch.tensor(values)
        batch.logp_teacher = logp_teacher

    # -- loop -----------------------------------------------------------------------------------------
    def run_eval(self) -> float:
        """Evaluate the learner's own model now, in line."""
        t0 = time.perf_counter()
        result = self.evaluate()  # its generations go through `on_base` themselves, its rewards stay here
        self._record_eval(self.progress.step, self.progress.version, result, time.perf_counter() - t0, by="learner")
        return result["accuracy"]

    def periodic_eval(self) -> None:
        """The evaluation every `eval_every` steps: in line, or started on a replica (`learner.replica_eval`)."""
        if self.replica_evals is None:
            self.run_eval()
            return
        self.take_replica_eval()  # one that finished during this step is taken, not mistaken for one still running
        if not self.replica_evals.start(self.progress.step, self.progress.version):
            self.events.write(EvalSkipped(step=self.progress.step,
                                          reason="the previous evaluation on a replica is still running"))

    def take_replica_eval(self, wait: bool = False) -> None:
        """Record an evaluation a replica has finished (with `wait`, the one still running); one that could not
        run there runs on the learner now."""
        if self.replica_evals is None:
            return
        done = self.replica_evals.wait() if wait else self.replica_evals.poll()
        if done is None:
            return
        if done.result is None:
            self.events.write(EvalFallback(step=done.step, error=done.error))
            log.warning("evaluation of step %d on a replica did not run (%s): evaluating on the learner", done.step,
                        done.error)
            self.run_eval()
            return
        r = done.result
        self._record_eval(done.step, done.version, {"accuracy": r.accuracy}, done.seconds, by="replica",
                          replica_id=r.replica_id, weight_versions=list(r.versions))

    def _record_eval(self, step: int, version: int, result: dict, seconds: float, **where) -> None:
        accuracy = result["accuracy"]
        self.progress.last_eval_accuracy = accuracy
        self.metrics.eval_accuracy.set(accuracy)
        scores = {k: v for k, v in result.items() if k != "accuracy"}
        self.events.write(Eval(step=step, version=version, accuracy=accuracy, seconds=seconds, scores=scores, **where))
        if self.sinks is not None:
            self.sinks.log(step, {f"eval/{k}": v for k, v in result.items()})
        log.info("eval step %d: %s", step, result)

    def save(self) -> None:
        """Checkpoint this step (in the background with `learner.checkpoint.background`, `learner.checkpoint_saver`)."""
        if self.saver is None or self._saved_step == self.progress.step:
            return
        # A checkpoint's version is committed at the controller before the checkpoint exists: a learner
        # restarted from it must never hold a version the controller has not seen.
        self.finish_push()
        p = self.progress
        meta = CheckpointMeta(p.step, p.version, p.data_position, time.time())
        covered, self._unacked = self._unacked, []
        groups, self._unacked_groups = self._unacked_groups, []
        self.on_base(self.saver.save, self.trainer.model, self.trainer.optimizer, meta, covered, groups)
        self._saved_step = p.step

    def resume(self, meta: CheckpointMeta, path: str) -> None:
        """Continue from a checkpoint whose model and optimizer state the trainer already holds."""
        self.resumed, self.resumed_path = meta, path
        self.progress.step, self.progress.version = meta.step, meta.version
        self.progress.data_position = meta.data_position
        self._saved_step = meta.step
        self.events.write(Resumed(from_step=meta.step, version=meta.version, path=path))

    def run(self, stop) -> LearnerProgress:
        cfg = self.config
        hb = self.stub.LearnerHeartbeat(controller_pb2.LearnerHeartbeatRequest(), timeout=30)
        if self.resumed is not None and hb.current_version < self.resumed.version:
            raise RuntimeError(
                f"the controller is at version {hb.current_version} but the checkpoint at step {self.resumed.step} "
                f"holds version {self.resumed.version}: start the controller with controller.start_version="
                f"{self.resumed.version} (asyncrl up --resume does)"
            )
        start_step, start_version = (self.resumed.step, self.resumed.version) if self.resumed else (0, 0)
        if self.resumed_path:
            # Trained into the checkpoint, but its learner died before acknowledging them: not again. Nor a
            # second copy of one of its groups (a buffer write retried after its reply was lost).
            covered = ack_covered(self.buffer, self.resumed_path, self.events)
            self.intake.mark_trained(covered.group_ids)
        if hb.current_version > start_version:
            # Restarted alone: the run went on after our checkpoint (or, with none, after the base model);
            # take it back there instead of training older weights under newer version numbers.
            if self.resumed is None:
                self.events.write(Resumed(from_step=0, version=0, path=self.model_path))
            self.intake.timeline = rejoin(self.buffer, self.stub, start_step, start_version,
                                          self.config.batch_size, self.events)
        self.progress.version = start_version
        self.events.write(LearnerStarted(total_steps=cfg.total_steps, from_step=start_step))
        # Entries delivered to us before a restart and never acked come first (all of them, in order):
        # trained after the last checkpoint or not at all, they are trained again from it.
        carry = self.buffer.all_pending()
        if carry:
            self.events.write(RecoveredPending(entries=[e.entry_id for e in carry]))
        evaluated_start = False
        while self.progress.step < cfg.total_steps and not stop.is_set():
            t0 = time.perf_counter()
            entries, carry = self.intake.collect(carry, stop)
            collect_s = time.perf_counter() - t0
            if not entries:
                break  # stopped while waiting for data
            if not evaluated_start:
                # The starting policy's evaluation waits for the first batch: replicas lease only once the
                # learner's push of these weights reached them (`controller.trust_initial_weights`), which it
                # makes while it waits for data; they generate during the evaluation, as they did before.
                evaluated_start = True
                self.run_eval()
            self.intake.start_prefetch(carry)
            self.train_on(entries, collect_s)
            carry += self.intake.take_prefetched()
            if cfg.eval_every and self.progress.step % cfg.eval_every == 0 and self.progress.step < cfg.total_steps:
                self.periodic_eval()
            self.take_replica_eval()
            every = cfg.checkpoint.save_every
            if every and self.progress.step % every == 0:
                self.save()
            if self.saver is not None:
                self.saver.poll()
        self.finish_push()
        self.take_replica_eval(wait=True)
        self.status.finish(self.progress)
        if self.progress.step >= cfg.total_steps:
            self.run_eval()
        self.save()
        if self.saver is not None:
            self.saver.wait()  # the run's last checkpoint is on disk and its entries acknowledged
        # What is still in the buffer at the end: the audit's proof that unconsumed data was not lost. A group
        # written after `snapshot_t` may be missing from the list; the audit counts it as written after the end.
        snapshot_t = time.time()
        self.events.write(FinalBuffer(entry_ids=self.buffer.entry_ids(), snapshot_t=snapshot_t))
        return self.progress

    def _refit_memory(self) -> None:
        """Once: the first step's measured peak plus the snapshots to come, against what the process can reach;
        the background checkpoint, then the background push, given up where they do not fit."""
        watch, self.memory_watch = self.memory_watch, None
        fit = watch.after_first_step()
        self.events.write(MemoryMeasured(peak=fit.peak, reachable=fit.reachable, predicted=fit.predicted,
                                         given_up=list(fit.given_up)))
        if not fit.given_up:
            return
        log.warning("the first step peaked at %.2f GiB; with the background snapshots the learner would need "
                    "more than the %.2f GiB it can reach: turning %s off", fit.peak / 2**30, fit.reachable / 2**30,
                    " and ".join(fit.given_up))
        if "learner.checkpoint.background" in fit.given_up and self.saver is not None:
            self.saver.in_line()
        if "learner.push_in_background" in fit.given_up:
            self.finish_push()
            self.config.push_in_background = False

    def publish(self, version: int, last: bool = False) -> float:
        """Push the new weights as `version`: started in the background (`learner.push_in_background`) after the
        previous push is finished, or pushed now; `last`: the run's last step (no push is reserved after it).
        Returns the seconds this cost the learner's critical path."""
        t0 = time.perf_counter()
        self.finish_push()
        if self.config.push_in_background:
            self.publisher.start(version, last)
        else:
            self._record_push(self.publisher.push(version, last))
        return time.perf_counter() - t0

    def finish_push(self) -> None:
        """Wait for the background push, if one is in flight, and record it (its failure is raised here)."""
        result = self.publisher.finish()
        if result is not None:
            self._record_push(result)

    def _record_push(self, push) -> None:
        self.metrics.observe_push(push)
        if self.sinks is not None:
            self.sinks.log(push.version, {"push/seconds": push.total_s, "push/bytes": push.bytes_sent})
        self.events.write(WeightsPushed(
            version=push.version, push_s=push.total_s, broadcast_s=push.broadcast_s, push_bytes=push.bytes_sent,
            receivers=push.receivers, acked=push.acked, dropped=push.dropped, attempts=push.attempts,
            new_group=push.new_group, background=push.background, in_band=push.in_band, begin_s=push.begin_s,
            acks_s=push.acks_s, commit_s=push.commit_s,
        ))

    def train_on(self, entries: list, collect_s: float = 0.0) -> None:
        """One step on `entries` (read in `collect_s` seconds), its push and its records."""
        version = self.progress.version
        t0 = time.perf_counter()
        batch = self.intake.batch_of(entries)
        learner_asked = self.teacher is not None and batch.logp_teacher is None
        if learner_asked:
            self.annotate(batch)  # the replicas did not (annotate_by learner, or the teacher failed them)
        prepare_s = time.perf_counter() - t0
        if self.ranks.sharded:
            self.ranks.broadcast((STEP, batch, version))
        metrics = self.on_base(train_step, self.trainer, batch, version, self.mirror)
        if self.memory_watch is not None:
            self._refit_memory()  # before the first push's snapshot and the first checkpoint's copy exist
        metrics["teacher/learner_asked"] = float(learner_asked)
        # Where the rest of the wall time goes (bench/async_speedup.py): reading and checking the batch
        # (waiting for data included), assembling it (and the teacher, when the learner asks it); of the
        # collection, the wait for late leases (`learner.stale_groups: hold`).
        metrics["time/collect_s"], metrics["time/prepare_s"] = collect_s, prepare_s
        metrics["time/stale_hold_s"] = self.intake.held_s
        if not metrics.pop("weights/finite"):
            # Updates with a non-finite loss or gradient are skipped, so this is a bug, not bad data: stop
            # before such weights reach a replica (the last checkpoint is intact).
            raise RuntimeError(f"non-finite weights after step {self.progress.step}: not pushing them")
        if self.saver is None:
            self.buffer.ack(batch.entry_ids)
        else:
            self._unacked.extend(batch.entry_ids)
            self._unacked_groups.extend(dict.fromkeys(batch.group_ids))
        self.intake.mark_trained(batch.group_ids, batch.entry_ids)
        self.events.write(Trained(step=self.progress.step, version=version, entry_ids=batch.entry_ids,
                                  group_ids=sorted(set(batch.group_ids)), trajectories=len(batch)))
        push_wait_s = self.publish(version + 1, last=self.progress.step + 1 >= self.config.total_steps)
        self.progress.step += 1
        self.progress.version = version + 1
        self.progress.consumed += len(batch)
        self.progress.take_figures(metrics)
        now = time.time()
        self.progress.last_wall_s = now - self._last_step_end if self._last_step_end else metrics["time/step_s"]
        self._last_step_end = now
        self.progress.busy_fraction = self.busy.add(metrics["time/step_s"], self.progress.last_wall_s)
        metrics["time/wall_s"], metrics["time/busy"] = self.progress.last_wall_s, self.progress.busy_fraction
        self.progress.data_position = max(
            [self.progress.data_position] + [entry.group.prompt_index + 1 for entry in entries]
        )
        self.metrics.observe_step(metrics, version + 1, push_wait_s, [entry.group.created_unix_s for entry in entries])
        if self.sinks is not None:
            self.sinks.log(self.progress.step, {**metrics, "push_wait_s": push_wait_s})
        self.events.write(Step(step=self.progress.step, version=version + 1, push_wait_s=push_wait_s, metrics=metrics))
        self.status.after_step(self.progress)  # at most every learner.status_interval_s
        if self.status.take_sync_request():
            self._resync()
