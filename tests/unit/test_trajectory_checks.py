"""Every kind of bad trajectory group is refused with the field it breaks (`asyncrl.core.buffer.trajectory_checks`)."""

import pytest

from asyncrl.core.buffer import trajectory_checks
from asyncrl.core.buffer.trajectory_checks import BadGroup, TrajectoryLimits, check_trajectory_group
from asyncrl.v1 import trajectory_pb2

LIMITS = TrajectoryLimits(vocab_size=20, max_sequence_tokens=16, max_response_tokens=5, group_size=2,
                          max_abs_reward=10.0, max_version=7)


def good_group() -> trajectory_pb2.TrajectoryGroup:
    return trajectory_pb2.TrajectoryGroup(group_id="g", trajectories=[
        trajectory_pb2.Trajectory(trajectory_id=f"g/{j}", group_id="g", prompt_token_ids=[1, 4, 5],
                                  response_token_ids=[6, 7, 2], logp_behav=[-0.5, -1.0, 0.0],
                                  weight_version=[6, 7, 7], reward=float(j))
        for j in range(2)
    ])


def test_a_good_group_passes_and_its_newest_version_comes_back(quick_look):
    assert check_trajectory_group(good_group(), LIMITS) == 7
    assert check_trajectory_group(good_group(), TrajectoryLimits(20, 16, 5, 2, 10.0, max_version=None)) == 7


def test_the_exact_walk_gives_the_newest_version_too(monkeypatch):
    monkeypatch.setattr(trajectory_checks, "_surely_passes", lambda *_: None)
    assert check_trajectory_group(good_group(), LIMITS) == 7


def damage(field, value, index=1):
    def apply(group):
        t = group.trajectories[index]
        if isinstance(value, list):
            del getattr(t, field)[:]
            getattr(t, field).extend(value)
        else:
            setattr(t, field, value)
    return apply


POISON = {
    "nan logp": (damage("logp_behav", [-0.5, float("nan"), -1.0]), "logp_behav holds a non-finite"),
    "-inf logp": (damage("logp_behav", [-0.5, float("-inf"), -1.0]), "logp_behav holds a non-finite"),
    "+inf logp": (damage("logp_behav", [float("inf"), -0.1, -1.0]), "logp_behav holds a non-finite"),
    "positive logp": (damage("logp_behav", [-0.5, 0.3, -1.0]), "> 0"),
    "nan reward": (damage("reward", float("nan")), "reward nan"),
    "huge reward": (damage("reward", 3e38), "reward.max_abs"),
    "inf reward": (damage("reward", float("inf")), "reward inf"),
    "future version": (damage("weight_version", [7, 8, 8]), "from the future"),
    "negative version": (damage("weight_version", [-1, 7, 7]), "< 0"),
    "token beyond vocabulary": (damage("response_token_ids", [6, 20, 2]), "response_token_ids outside"),
    "negative prompt token": (damage("prompt_token_ids", [1, -3]), "prompt_token_ids outside"),
    "length mismatch": (damage("logp_behav", [-0.5]), "3 tokens but 1 logp_behav"),
    "empty response": (damage("response_token_ids", []), "empty response_token_ids"),
    "empty prompt": (damage("prompt_token_ids", []), "empty prompt_token_ids"),
    "response longer than max_new_tokens": (
        lambda g: [damage(f, v)(g) for f, v in (("response_token_ids", [3] * 6), ("logp_behav", [-1.0] * 6),
                                                ("weight_version", [7] * 6))], "max_new_tokens"),
    "longer than the context": (damage("prompt_token_ids", [1] * 14), "context"),
    "bad teacher log-probs": (damage("logp_teacher", [-1.0, float("nan"), -2.0]), "logp_teacher"),
    "teacher length": (damage("logp_teacher", [-1.0]), "logp_teacher"),
    "oversized group": (lambda g: g.trajectories.append(g.trajectories[0]), "expected sampling.group_size"),
    "empty group": (lambda g: g.ClearField("trajectories"), "0 in the group"),
    # What a token holder wrote into a live stream and saw trained (issue: input that is still believed).
    "most negative prompt index": (lambda g: setattr(g, "prompt_index", -(2**63)), "prompt_index: must be in"),
    "right-to-left override": (lambda g: g.metadata.update(answer="12\u202e34"), r"metadata\['answer'\]: .*U\+202E"),
    "NUL in metadata": (lambda g: g.metadata.update(answer="12\x0034"), r"U\+0000"),
    "2000 combining marks": (lambda g: g.metadata.update(answer="e" + "\u0301" * 2000), "combining marks"),
    "52 MB of metadata": (lambda g: g.metadata.update({f"k{i}": "x" * (1 << 20) for i in range(52)}),
                          "metadata: at most 64 entries|more than 4194304 characters"),
    "one huge metadata value": (lambda g: g.metadata.update(big="x" * ((1 << 20) + 1)), "at most 1048576"),
    "group id with a newline": (lambda g: setattr(g, "group_id", "g\nforged line"), "group_id: must be an id"),
    "trajectory of another group": (damage("group_id", "other"), "is not a trajectory of group"),
    "lease id with spaces": (lambda g: setattr(g, "lease_id", "lease one"), "lease_id: must be empty or an id"),
}


def test_real_text_in_metadata_passes():
    """Right-to-left marks, combining accents, CJK, emoji, tabs and newlines are text, not attacks."""
    group = good_group()
    group.metadata.update(question="مرحبا\u200f بالعالم; Tiê\u0301ng Viê\u0323t; 東京; 😀\tline\nnext",
                          answer="42", prompt_index_note="x" * 10_000)
    group.prompt_index, group.replica_id, group.lease_id = 12345, "replica-1", "lease-ab12:3"
    assert check_trajectory_group(group, LIMITS) == 7


@pytest.fixture(params=["lists", "numpy"])
def quick_look(request, monkeypatch):
    """The quick look over a group runs on Python lists for few values and on numpy arrays for many: every
    case runs through both."""
    if request.param == "numpy":
        monkeypatch.setattr(trajectory_checks, "_FEW_VALUES", 0)
    return request.param


@pytest.mark.parametrize("kind", sorted(POISON))
def test_poison_is_refused_with_its_field(kind, quick_look):
    apply, message = POISON[kind]
    group = good_group()
    apply(group)
    with pytest.raises(BadGroup, match=message.replace("(", r"\(")):
        check_trajectory_group(group, LIMITS)


def grown(group, n: int, sample_index: int | None):
    """`group` with n trajectories (copies of its first), and `sample_index` set when given."""
    del group.trajectories[1:]
    for j in range(1, n):
        t = group.trajectories.add()
        t.CopyFrom(group.trajectories[0])
        t.trajectory_id = f"g/{j}"
    if sample_index is not None:
        group.sample_index = sample_index
    return group


def test_a_hard_prompts_larger_group_passes_only_as_a_prompt_sampled_again():
    hard = TrajectoryLimits(20, 16, 5, 2, 10.0, max_version=7, hard_group_size=4)
    assert check_trajectory_group(grown(good_group(), 4, sample_index=3), hard) == 7
    with pytest.raises(BadGroup, match=r"trajectories: 4 in the group, expected sampling.group_size = 2, or "
                                       r"controller.difficulty.hard_group_size = 4 .*sample_index"):
        check_trajectory_group(grown(good_group(), 4, sample_index=None), hard)  # a stream prompt gets G
    with pytest.raises(BadGroup, match="trajectories: 3 in the group"):
        check_trajectory_group(grown(good_group(), 3, sample_index=3), hard)
    with pytest.raises(BadGroup, match=r"expected sampling.group_size = 2$"):
        check_trajectory_group(grown(good_group(), 4, sample_index=3), LIMITS)  # no hard groups in this run
