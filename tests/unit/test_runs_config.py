"""A deployment of several LoRA runs (`runs:`): each run's config derived from the deployment's and its overrides
(`asyncrl.core.config.runs`), against hand-written values; what a run may not set, and what the deployment
needs, refused naming the key."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from asyncrl.core.buffer.redis_users import rules, user_name
from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import load_config
from asyncrl.core.config.runs import PORT_STRIDE, BankShape, bank_shape, check_change, run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.tools.cli import main
from asyncrl.tools.port_plan import planned_ports

BASE = {"run_dir": "runs/d", "model": {"path": "m"}, "learner": {"lora": {"enabled": True}, "port": 7000},
        "controller": {"port": 6000, "status_port": 0}}


def deployment(runs, **sections) -> AsyncRLConfig:
    tree = {**BASE, **sections, "runs": runs}
    return AsyncRLConfig.model_validate(tree)


def test_each_run_gets_its_own_directory_keys_and_ports_and_its_overrides():
    cfg = deployment([{"name": "a"},
                      {"name": "b", "weight": 2, "overrides": {"learner": {"lr": 1e-3, "lora": {"rank": 4}},
                                                               "task": {"num_digits": 3}, "controller": {"eta": 0},
                                                               "seed": 5}}])
    a, b = run_configs(cfg).values()
    assert (a.run_dir, b.run_dir) == ("runs/d/a", "runs/d/b")
    assert (a.buffer.stream, b.buffer.stream) == ("asyncrl:trajectories:a", "asyncrl:trajectories:b")
    assert (a.buffer.dead_letter_stream, b.buffer.dead_letter_stream) == ("asyncrl:dead-letters:a",
                                                                          "asyncrl:dead-letters:b")
    assert (a.controller.state_key, b.controller.state_key) == ("asyncrl:controller:a", "asyncrl:controller:b")
    # Fixed ports move by the stride; a port left at 0 (picked free) stays 0.
    assert (a.controller.port, b.controller.port) == (6000, 6000 + PORT_STRIDE)
    assert (a.learner.port, b.learner.port) == (7000, 7000 + PORT_STRIDE)
    assert a.controller.status_port == b.controller.status_port == 0
    # The overrides are b's alone; what a run does not set is the deployment's.
    assert (a.learner.lr, b.learner.lr) == (cfg.learner.lr, 1e-3)
    assert (a.learner.lora.rank, b.learner.lora.rank) == (16, 4)
    assert b.learner.lora.enabled and b.learner.lora.alpha == cfg.learner.lora.alpha
    assert (a.task.num_digits, b.task.num_digits) == (2, 3)
    assert (a.controller.eta, b.controller.eta, b.seed) == (cfg.controller.eta, 0, 5)
    assert a.runs == b.runs == []
    assert (a.run_name, b.run_name, cfg.run_name) == ("a", "b", "")  # the `run` label of their metrics
    assert run_configs(AsyncRLConfig.model_validate({"model": {"path": "m"}})) == {}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model": {"path": "other"}}, "model: shared by every run of the deployment"),
    ({"rollout": {"replicas": 4}}, "rollout: shared by every run"),
    ({"learner": {"device": "cuda"}}, "learner.device: shared by every run"),
    ({"controller": {"port": 1}}, "controller.port: shared by every run"),
    ({"learner": {"lora": {"enabled": False}}}, "learner.lora.enabled: every run"),
    ({"learner": 3}, "learner: a section"),
    ({"run_name": "other"}, "run_name: made from the run's `name`"),
])
def test_a_run_may_set_only_its_own_keys(overrides, message):
    with pytest.raises(ValidationError, match=message):
        deployment([{"name": "a", "overrides": overrides}])


def test_a_runs_own_config_error_names_the_run_and_the_key():
    cfg = deployment([{"name": "a"}, {"name": "b", "overrides": {"learner": {"batch_size": 12}}}])
    with pytest.raises(ConfigError, match=r"runs\[1\] \(b\): learner.batch_size \(12\) must be a multiple of "
                                          r"sampling.group_size \(8\)"):
        run_configs(cfg)


@pytest.mark.parametrize(("runs", "sections", "message"), [
    ([{"name": "a"}, {"name": "a"}], {}, "runs: each run needs a name of its own; a appear"),
    ([{"name": "a"}], {"learner": {"lora": {"enabled": False}}}, "needs learner.lora.enabled: true"),
    ([{"name": "a"}], {"learner": {"lora": {"enabled": True}, "eval_by": "replica"}}, "needs learner.eval_by: learner"),
])
def test_what_a_deployment_of_several_runs_needs_is_named(runs, sections, message):
    cfg = deployment(runs, **sections)
    with pytest.raises(ConfigError, match=message):
        run_configs(cfg)


def test_the_runs_share_the_deployments_teacher_and_each_chooses_whether_it_distils():
    teacher = {"enabled": True, "annotate": True, "model_path": "t", "port": 7000}
    opd = {"learner": {"algo": {"opd": {"enabled": True}}}}
    cfg = deployment([{"name": "a", "overrides": opd}, {"name": "b", "overrides": {"teacher": {"annotate": False}}}],
                     teacher=teacher)
    a, b = run_configs(cfg).values()
    assert a.teacher == cfg.teacher and b.teacher == cfg.teacher.model_copy(update={"annotate": False})
    assert (a.learner.algo.opd.enabled, b.learner.algo.opd.enabled) == (True, False)
    with pytest.raises(ValidationError, match=r"teacher.model_path: shared by every run of the deployment; a run "
                                              r"may set teacher.\{annotate\}"):
        deployment([{"name": "a", "overrides": {"teacher": {"model_path": "other"}}}], teacher=teacher)
    cfg = deployment([{"name": "a", "overrides": {**opd, "teacher": {"annotate": False}}}], teacher=teacher)
    with pytest.raises(ConfigError, match=r"runs\[0\] \(a\): .*learner.algo.opd.enabled needs teacher.enabled and "
                                          r"teacher.annotate"):
        run_configs(cfg)


def test_each_run_plays_its_own_environment():
    tools = {"type": "tools", "tools": ["examples/agent/tools.py:add"], "max_turns": 3}
    cfg = deployment([{"name": "agent", "overrides": {"environment": tools}}, {"name": "direct"}])
    agent, direct = run_configs(cfg).values()
    assert (agent.environment.type, agent.environment.max_turns) == ("tools", 3)
    assert direct.environment == cfg.environment and direct.environment.type == "none"
    with pytest.raises(ConfigError, match=r"runs\[0\] \(agent\): .*environment.openenv.url: name the OpenEnv server"):
        run_configs(deployment([{"name": "agent", "overrides": {"environment": {"type": "openenv"}}}]))


def test_a_deployment_on_vllm_keeps_loaded_the_versions_each_runs_eta_needs():
    cfg = deployment([{"name": "a"}, {"name": "b", "overrides": {"controller": {"eta": 5}}}],
                     rollout={"engine": {"type": "vllm"}})
    assert list(run_configs(cfg)) == ["a", "b"]
    assert bank_shape(cfg).versions_kept == 5 + 2  # η + 1 versions, and one for a batch started before a push


@pytest.mark.parametrize("name", ["A", "1a", "a_b", "a" * 32, ""])
def test_run_names_are_what_keys_and_paths_can_hold(name):
    with pytest.raises(ValidationError, match="runs.0.name"):
        deployment([{"name": name}])


def test_loading_a_file_checks_every_runs_config(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs": [{"name": "a", "overrides": {"learner": {"batch_size": 7}}}]}))
    with pytest.raises(ConfigError, match=r"runs\[0\] \(a\): learner.batch_size"):
        load_config(path)


def test_a_runs_controller_is_named_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs": [{"name": "a"}, {"name": "b"}]}))
    assert main(["controller", "--config", str(path)]) == 2
    assert "--run: each run of this deployment has a controller of its own; name one of a, b" in capsys.readouterr().err
    assert main(["controller", "--config", str(path), "--run", "c"]) == 2
    assert "name one of a, b (not 'c')" in capsys.readouterr().err


def test_every_runs_ports_are_planned_and_redis_users_reach_only_their_runs_keys():
    cfg = deployment([{"name": "a"}, {"name": "b"}], rollout={"replicas": 2, "port": 9000},
                     teacher={"enabled": True, "model_path": "t", "port": 7000})
    ports = {(p.owner, p.key): p.port for p in planned_ports(cfg)}
    assert ports[("run a: the controller", "controller.port")] == 6000
    assert ports[("run b: the controller", "controller.port")] == 6100
    assert ports[("run b: replica-1", "rollout.port")] == 9101
    assert [key for key in ports if key[1] == "teacher.port"] == [("the teacher", "teacher.port")]  # one, shared
    a, b = run_configs(cfg).values()
    shared = rules("learner", a.buffer, a.controller.state_key, (b.buffer, b.controller.state_key))
    assert shared.startswith("resetkeys ~asyncrl:trajectories:a ~asyncrl:dead-letters:a "
                             "~asyncrl:trajectories:b ~asyncrl:dead-letters:b ")
    own = rules("controller", b.buffer, b.controller.state_key)
    assert own.startswith("resetkeys ~asyncrl:controller:b:* ~asyncrl:trajectories:b:written:* ")
    assert user_name("controller", "b") == "asyncrl-controller-b"


@pytest.mark.parametrize(("before", "after", "sections", "message"), [
    # a new run whose rank the replicas' slots cannot hold
    ([{"name": "a"}], [{"name": "a"}, {"name": "b", "overrides": {"learner": {"lora": {"rank": 32}}}}],
     {"rollout": {"max_runs": 2}}, "run 'b': learner.lora.rank 32 is above the 16"),
    # more active runs than the banks have slots for
    ([{"name": "a"}], [{"name": "a"}, {"name": "b"}], {}, "rollout.max_runs: the replicas hold adapter slots for 1"),
    # a new run adapting a module the banks do not
    ([{"name": "a"}], [{"name": "a"}, {"name": "b", "overrides": {"learner": {"lora": {"target_modules": ["lm_x"]}}}}],
     {"rollout": {"max_runs": 2}, "learner": {"lora": {"enabled": True, "target_modules": ["q_proj"]}}},
     r"run 'b': learner.lora.target_modules \['lm_x'\] are not among the modules the replicas adapt \(q_proj"),
    # a run's settings changed live, an entry dropped, a removed run back
    ([{"name": "a"}], [{"name": "a", "weight": 3}], {}, "run 'a' cannot change while the deployment lives"),
    ([{"name": "a"}, {"name": "b"}], [{"name": "a"}], {}, "a run's entry stays"),
    ([{"name": "a"}, {"name": "b", "removed": True}], [{"name": "a"}, {"name": "b"}], {}, "run 'b' cannot change"),
])
def test_a_live_change_the_deployment_cannot_make_is_refused_naming_why(before, after, sections, message):
    with pytest.raises(ConfigError, match=message):
        check_change(deployment(before, **sections), deployment(after, **sections))


def test_a_live_change_adds_runs_and_removes_them_keeping_their_places():
    before = deployment([{"name": "a"}, {"name": "b"}], rollout={"max_runs": 3})
    after = deployment([{"name": "a"}, {"name": "b", "removed": True}, {"name": "c"}, {"name": "d"}],
                 rollout={"max_runs": 3})
    assert check_change(before, after) == ["c", "d"]
    assert list(run_configs(after)) == ["a", "c", "d"] and list(run_configs(after, removed=True)) == ["a", "b", "c", "d"]
    assert run_configs(after)["d"].controller.port == 6000 + 3 * PORT_STRIDE  # its place in the list, b's kept
    assert bank_shape(before) == BankShape(runs=3, max_rank=16, targets=tuple(before.learner.lora.target_modules))
