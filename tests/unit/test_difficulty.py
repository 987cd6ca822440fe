"""Difficulty-aware sampling (controller/difficulty.py, controller.difficulty): pass rates per prompt from the
completions' mean rewards, the pool of hard prompts, how often a lease samples one again, what is persisted
and restored; then the controller granting such leases and learning from their completions."""

from __future__ import annotations

import time

import pytest

from asyncrl.controller.difficulty import DifficultyBook
from asyncrl.controller.persistence import MemoryStore
from asyncrl.core.config.controller import DifficultyConfig
from tests.fakes import make_state


def book(**cfg) -> DifficultyBook:
    return DifficultyBook(DifficultyConfig(**cfg), seed=0)


def test_the_pass_rate_is_the_mean_reward_over_every_sample_seen():
    b = book()
    b.observe(5, 8, 0.25)
    b.observe(5, 4, 1.0)
    assert b.pass_rate(5) == pytest.approx((8 * 0.25 + 4 * 1.0) / 12) and b.pass_rate(6) is None


@pytest.mark.parametrize(("reward_mean", "hard"), [(0.0, True), (0.2, True), (0.25, False), (0.9, False)])
def test_a_prompt_is_hard_below_the_threshold(reward_mean, hard):
    b = book(hard_below=0.25, replay_share=0.5)
    b.observe(1, 8, reward_mean)
    assert b.hard == int(hard)


def test_a_hard_prompt_is_sampled_again_at_most_max_replays_times():
    b = book(replay_share=0.9, max_replays=2)
    b.observe(7, 8, 0.0)
    chosen = [b.choose() for _ in range(50)]
    assert chosen.count(7) == 2 and set(chosen) == {7, None} and b.hard == 0 and b.replays_total == 2


def test_off_by_default_and_nothing_to_choose_from_an_empty_pool():
    off = book()
    off.observe(1, 8, 0.0)
    assert off.hard == 1 and all(off.choose() is None for _ in range(100))
    assert book(replay_share=0.9).choose() is None


def test_the_share_of_leases_that_sample_again_is_the_configured_one():
    b = book(replay_share=0.3, max_replays=1_000_000)
    b.observe(1, 8, 0.0)
    picks = sum(b.choose() is not None for _ in range(20_000))
    assert picks / 20_000 == pytest.approx(0.3, abs=0.015)


def test_only_the_newest_prompts_are_kept_and_the_forgotten_leave_the_pool():
    b = book(max_prompts=2, replay_share=0.5)
    for prompt in (1, 2, 3):
        b.observe(prompt, 8, 0.0)
    assert b.tracked == 2 and b.pass_rate(1) is None and b.hard == 2
    changed, forgotten = b.changes()
    assert set(changed) == {2, 3} and forgotten == [1]
    assert b.changes() == ({}, [])  # reported once
    b.observe(1, 8, 0.0)  # a late completion for a forgotten prompt: kept, and 2 forgotten in its place
    changed, forgotten = b.changes()
    assert set(changed) == {1} and forgotten == [2]


def test_what_is_persisted_restores_the_same_book():
    b = book(replay_share=0.9, max_replays=3)
    b.observe(1, 8, 0.0)
    b.observe(2, 8, 0.625)
    b.choose()
    changed, _ = b.changes()
    again = book(replay_share=0.9, max_replays=3)
    again.restore(changed)
    assert again.pass_rate(2) == 0.625 and again.hard == b.hard == 1 and again.replays_total == 1


def test_the_controller_hands_out_hard_prompts_and_learns_from_completions_across_a_restart():
    store = MemoryStore()
    state, _, _, events = make_state(batch_size=64, eta=None, store=store,
                                     difficulty={"replay_share": 0.9, "max_replays": 100})
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    first = state.admission.try_acquire_many(rid, 8, 1, time.monotonic(), final=True).leases[0]
    assert first.sample_index is None  # nothing known yet: the stream's next prompt
    assert state.admission.complete_many(rid, [(first.lease_id, 8, 0.0)]) == [""]
    assert events.of_kind("lease_completed")[-1]["reward_mean"] == 0.0
    leases = state.admission.try_acquire_many(rid, 8, 7, time.monotonic(), final=True).leases
    again = [d for d in leases if d.sample_index is not None]
    assert again and all(d.sample_index == first.prompt_index for d in again)
    assert len({d.prompt_index for d in leases}) == 7  # each lease keeps a stream position of its own
    granted = {e["lease_id"]: e for e in events.of_kind("lease_granted")}
    assert all(granted[d.lease_id]["sample_index"] == d.sample_index for d in leases)
    # A replayed lease's rewards count for the prompt it sampled.
    state.admission.complete_many(rid, [(again[0].lease_id, 8, 1.0)])
    assert state.books.difficulty.pass_rate(first.prompt_index) == 0.5
    assert state.snapshot()["difficulty"]["replays"] == len(again)
    state.close()
    restarted, _, _, _ = make_state(batch_size=64, eta=None, store=store,
                                    difficulty={"replay_share": 0.9, "max_replays": 100})
    assert restarted.books.difficulty.pass_rate(first.prompt_index) == 0.5
    kept = {lease.lease_id: lease.sample_index for lease in restarted.books.leases.active()}
    assert kept and all(kept[d.lease_id] == d.sample_index for d in leases if d.lease_id in kept)
    restarted.close()


def test_a_hard_group_is_chosen_only_where_it_fits_the_step():
    b = book(replay_share=0.9, max_replays=1_000, hard_group_size=16)
    b.observe(3, 8, 0.0)
    assert b.group_size(8) == 16 and book().group_size(8) == 8
    assert all(b.choose(room=8) is None for _ in range(50))  # 8 places left in the step: a group of 16 straddles
    assert any(b.choose(room=16) == 3 for _ in range(50))


def test_hard_prompts_get_larger_groups_that_never_straddle_a_step_and_keep_eta():
    """B = 64, G = 8, hard groups of 16, η = 0: the leases of each version add up to B exactly, every hard lease
    lies within one step's 64 (N_r before it and after it in the same window), and N_r stops at (i+η+1)·B."""
    state, _, _, events = make_state(batch_size=64, eta=0,
                                     difficulty={"replay_share": 0.5, "max_replays": 1_000, "hard_group_size": 16})
    rid = state.register("127.0.0.1:7001", "", 0, "torch").replica_id
    first = state.admission.try_acquire_many(rid, 8, 1, time.monotonic(), final=True).leases[0]
    assert first.num_trajectories == 8
    state.admission.complete_many(rid, [(first.lease_id, 8, 0.0)])  # its prompt is hard now
    leases = state.admission.try_acquire_many(rid, 8, 64, time.monotonic(), final=True).leases
    sizes = [d.num_trajectories for d in leases]
    assert set(sizes) == {8, 16} and 8 + sum(sizes) == 64  # η = 0: version 0 admits exactly B
    assert all((d.num_trajectories == 16) == (d.sample_index is not None) for d in leases)
    granted = events.of_kind("lease_granted")
    for e in granted:
        assert (e["admitted_after"] - e["n"]) // 64 == (e["admitted_after"] - 1) // 64  # one step's window
    assert [e["n"] for e in granted] == [8, *sizes]
    assert state.admission.try_acquire_many(rid, 8, 1, time.monotonic(), final=True).leases == []
