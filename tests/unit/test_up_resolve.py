"""What `asyncrl up` decides at start: a run directory of its own, free ports only where the user chose none."""

import pytest

from asyncrl.core.config.file import load_config
from asyncrl.tools.cli import main
from asyncrl.tools.launcher import claim_run_dir, resolve


def test_two_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path):
    template = str(tmp_path / "runs" / "{time}")
    first, second = claim_run_dir(template), claim_run_dir(template)
    assert first != second and second.startswith(first)  # "<time>" and "<time>-2" (or the next second)
    assert claim_run_dir(str(tmp_path / "fixed")) == str(tmp_path / "fixed")  # no {time}: used as given


def test_ports_set_by_the_user_are_kept_the_others_are_picked(tmp_path, monkeypatch):
    """The defaults are replaced by the ports the kernel offers (fixed here: a real offer may be the default
    itself, 50051 lying in the ephemeral range)."""
    from asyncrl.tools import launcher

    offered = iter([40001, 40002])
    monkeypatch.setattr(launcher, "free_port", lambda host: next(offered))
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"run_dir: {tmp_path}/r-{{time}}\n")
    cfg = resolve(load_config(config_file, ["controller.status_port=18080"]))
    assert (cfg.controller.status_port, cfg.controller.port, cfg.teacher.port) == (18080, 40001, 40002)


def test_a_picked_port_is_never_one_the_config_fixes_for_another_process(tmp_path, monkeypatch):
    """The kernel may offer a port the config fixes inside its ephemeral range (replica 1's metrics here, the
    configured port + 1): `up` passes over it, and over the port it just picked, as a process would fail to
    bind it."""
    from asyncrl.tools import launcher

    offered = iter([40001, 40002, 40002, 40010, 40011, 40012])
    monkeypatch.setattr(launcher, "free_port", lambda host: next(offered))
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"run_dir: {tmp_path}/r-{{time}}\nteacher:\n  enabled: true\n  model_path: /m\n")
    cfg = resolve(load_config(config_file, ["rollout.replicas=2", "rollout.metrics_port=40000",
                                            "learner.metrics_port=40010"]))
    assert (cfg.controller.port, cfg.controller.status_port, cfg.teacher.port) == (40002, 40011, 40012)


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("asyncrl ")


def test_a_run_without_a_configured_token_gets_one_and_a_resumed_run_keeps_it(tmp_path, capsys, monkeypatch):
    from asyncrl.core.config.schema import AsyncRLConfig
    from asyncrl.tools.run_secrets import run_auth

    cfg = AsyncRLConfig.model_validate({"run_dir": str(tmp_path)})
    monkeypatch.delenv(cfg.security.token_env, raising=False)
    run_auth(cfg)
    token_file = tmp_path / "token"
    token = token_file.read_text().strip()
    assert token and token_file.stat().st_mode & 0o777 == 0o600
    assert "generated the run's access token" in capsys.readouterr().out
    monkeypatch.delenv(cfg.security.token_env)  # a new `up --resume` process
    run_auth(cfg)
    assert token_file.read_text().strip() == token
    assert "using the run's access token" in capsys.readouterr().out


def test_a_refused_start_leaves_no_run_directory_behind(tmp_path, capsys):
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"run_dir: {tmp_path}/runs/r-{{time}}\nmodel: {{path: {tmp_path}/no-such-model}}\n")
    assert main(["up", "--config", str(config_file)]) == 2
    assert "config error: model.path" in capsys.readouterr().err
    assert list((tmp_path / "runs").iterdir()) == []  # the claimed "{time}" directory is gone again


def test_a_config_without_a_teacher_section_runs_no_teacher(tmp_path, capsys):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("model: {path: /models/mine}\n")
    cfg = load_config(config_file)
    assert not cfg.teacher.enabled and not cfg.teacher.annotate
    with pytest.raises(ValueError, match=r"teacher\.model_path: required"):
        load_config(config_file, ["teacher.enabled=true"])
    assert main(["up", "--config", str(config_file), "--set", "teacher.enabled=true"]) == 2
    assert capsys.readouterr().err.startswith("asyncrl up: config error: teacher.model_path: required when")
    cfg = load_config(config_file, ["teacher.enabled=true", "teacher.model_path=/models/teacher",
                                    "teacher.annotate=true"])
    assert cfg.teacher.enabled and cfg.teacher.model_path == "/models/teacher"


def test_a_config_without_a_model_path_is_refused_naming_the_key_not_given_the_demo_model(tmp_path, capsys):
    # The demo's checkpoint exists in a checkout that ran the demo: a config without model.path must still
    # not train it.
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"run_dir: {tmp_path / 'runs' / 'mine'}\n")
    assert load_config(config_file).model.path == ""
    assert main(["up", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err.startswith("asyncrl up: config error: model.path: required")
    assert not (tmp_path / "runs" / "mine").exists()


def test_each_vllm_engine_on_cpu_is_bound_to_a_core_of_its_roles_own_round_robin(monkeypatch):
    from asyncrl.core.config.rollout import EngineConfig
    from asyncrl.tools.launcher import vllm_cpu_binding

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    vllm = EngineConfig(type="vllm")
    # A replica pinned away from the learner (`rollout.cpus`) computes on its own cores, not the machine's first.
    assert [vllm_cpu_binding(vllm, i, [1])["VLLM_CPU_OMP_THREADS_BIND"] for i in range(3)] == ["1", "1", "1"]
    assert [vllm_cpu_binding(vllm, i, [2, 3])["VLLM_CPU_OMP_THREADS_BIND"] for i in range(3)] == ["2", "3", "2"]
    assert [vllm_cpu_binding(vllm, i)["VLLM_CPU_OMP_THREADS_BIND"] for i in range(5)] == ["0", "1", "2", "3", "0"]
    assert vllm_cpu_binding(EngineConfig(type="torch"), 0, [1]) == {}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert vllm_cpu_binding(vllm, 0, [1]) == {}  # the user's own binding wins
