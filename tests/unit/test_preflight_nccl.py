"""`asyncrl up` refuses a NCCL weight push that cannot form on one machine: NCCL refuses two ranks on one GPU
("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device", NCCL 2.28 on an H100), so every rank of a
push needs a GPU of its own; the error names the key. Pure config logic: no GPU needed."""

import pytest

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.preflight import check_local_nccl
from asyncrl.core.config.schema import AsyncRLConfig


def config(**learner_and_rollout) -> AsyncRLConfig:
    learner = {"weight_transport": {"type": "nccl"}, "device": "cuda:0", **learner_and_rollout.get("learner", {})}
    rollout = {"replicas": 1, "engine": {"type": "torch", "device": "cuda:1"}, **learner_and_rollout.get("rollout", {})}
    return AsyncRLConfig.model_validate({"learner": learner, "rollout": rollout})


def test_a_learner_and_one_replica_on_gpus_of_their_own_pass():
    check_local_nccl(config())
    check_local_nccl(config(learner={"device": "cuda", "world_size": 2},
                            rollout={"engine": {"type": "torch", "device": "cuda:2"}}))


def test_gloo_is_never_refused():
    check_local_nccl(config(learner={"weight_transport": {"type": "gloo"}, "device": "cpu"},
                            rollout={"replicas": 4, "engine": {"type": "torch", "device": "cuda"}}))


@pytest.mark.parametrize("changes, why", [
    ({"learner": {"device": "cpu"}}, "nccl pushes GPU tensors, but learner.device is 'cpu'"),
    ({"rollout": {"replicas": 2}}, "the 2 replicas `up` starts share rollout.engine.device"),
    ({"rollout": {"engine": {"type": "torch", "device": "cuda"}}}, "rollout.engine.device is 'cuda' and the learner uses cuda:0"),
    ({"rollout": {"engine": {"type": "torch", "device": "cpu"}}}, "rollout.engine.device is 'cpu'"),
    ({"learner": {"device": "cuda", "world_size": 2}}, "the learner uses cuda:0, cuda:1"),
])  # fmt: skip
def test_a_push_that_cannot_form_is_a_config_error_naming_the_key(changes, why):
    with pytest.raises(ConfigError, match=r"^learner\.weight_transport\.type: ") as err:
        check_local_nccl(config(**changes))
    assert why in str(err.value)
