import pytest
import torch

from asyncrl.core.buffer import BufferEntry
from asyncrl.learner.batch import MalformedGroup, assemble, staleness_stats
from asyncrl.v1 import trajectory_pb2


def traj(gid, j, resp, versions, reward=1.0, prompt=(1, 2, 3)):
    return trajectory_pb2.Trajectory(trajectory_id=f"{gid}/{j}", group_id=gid, prompt_token_ids=list(prompt),
                                     response_token_ids=resp, logp_behav=[-0.1 * (k + 1) for k in range(len(resp))],
                                     weight_version=versions, reward=reward)


def entry(eid, gid, trajs):
    return BufferEntry(eid, trajectory_pb2.TrajectoryGroup(group_id=gid, trajectories=trajs))


def sample_entries():
    return [
        entry("1-0", "a", [traj("a", 0, [5, 6, 7], [3, 3, 4], 1.0), traj("a", 1, [5], [3], 0.0)]),
        entry("2-0", "b", [traj("b", 0, [8, 9], [1, 1], 0.5, prompt=(4,)), traj("b", 1, [8, 9, 9, 9], [2, 2, 2, 2], 0.0)]),
    ]


def test_assemble_pads_and_aligns():
    b = assemble(sample_entries())
    assert len(b) == 4
    assert b.response_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert b.sequences[0] == [1, 2, 3, 5, 6, 7] and b.response_starts == [3, 3, 1, 3]
    assert b.group_index.tolist() == [0, 0, 1, 1]
    assert b.rewards.tolist() == [1.0, 0.0, 0.5, 0.0]
    assert torch.allclose(b.logp_behav[0], torch.tensor([-0.1, -0.2, -0.3, 0.0]))
    assert b.token_versions[1].tolist() == [3, -1, -1, -1]
    assert b.logp_teacher is None
    assert b.entry_ids == ["1-0", "2-0"]


def test_rows_trims_to_own_width():
    sub = assemble(sample_entries()).rows([1, 2])
    assert sub.response_mask.shape == (2, 2)
    assert sub.sequences == [[1, 2, 3, 5], [4, 8, 9]]
    assert sub.group_index.tolist() == [0, 1]


def test_staleness_uses_oldest_token_version():
    # learner at version 4: oldest versions per row are 3, 3, 1, 2 -> staleness 1, 1, 3, 2
    s = staleness_stats(assemble(sample_entries()), version=4)
    assert s["staleness/mean"] == pytest.approx(7 / 4)
    assert s["staleness/max"] == 3
    assert s["staleness/hist"] == {"1": 2, "2": 1, "3": 1}
    assert s["staleness/multi_version_frac"] == pytest.approx(1 / 4)  # only row 0 spans versions 3..4


@pytest.mark.parametrize("bad, message", [
    (traj("x", 0, [], []), "empty response"),
    (trajectory_pb2.Trajectory(trajectory_id="x/0", group_id="x", prompt_token_ids=[1], response_token_ids=[2, 3],
                               logp_behav=[-1.0], weight_version=[0, 0]), "2 tokens but 1 logp_behav"),
    (traj("x", 0, [5], [0], prompt=()), "empty prompt"),
])
def test_malformed_groups_name_the_problem(bad, message):
    with pytest.raises(MalformedGroup, match=message) as info:
        assemble([entry("9-0", "x", [bad])])
    assert info.value.group_id == "x"


def test_the_batch_knows_which_responses_were_cut_and_the_advantages_report_the_truncated_share():
    from asyncrl.core.algo.config import AlgoConfig
    from asyncrl.learner.algos.advantage_builder import build_advantages

    entries = sample_entries()
    entries[1].group.trajectories[1].finished = True  # the others were cut at max_new_tokens (finished unset)
    entries[0].group.trajectories[0].finished = True
    batch = assemble(entries)
    assert batch.finished.tolist() == [True, False, False, True]
    assert batch.rows([1, 3]).finished.tolist() == [False, True]
    result = build_advantages(batch.rewards, batch.group_index, batch.response_mask, AlgoConfig(),
                              finished=batch.finished)
    assert result.metrics["length/truncated_frac"] == 0.5
    # Rewards above success_reward (0 by default) count as correct: the 3- and 2-token responses; 1 and 4 not.
    assert result.metrics["length/correct_mean"] == 2.5 and result.metrics["length/incorrect_mean"] == 2.5
