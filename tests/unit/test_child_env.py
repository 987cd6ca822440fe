"""The environment `asyncrl up` gives its processes (`asyncrl.tools.spawners.child_env`): OpenMP threads that
sleep while they wait, since the run's processes share the cores, unless the user's environment says
otherwise; unbuffered output; a service's own variables on top."""

from __future__ import annotations

from asyncrl.tools.spawners import child_env


def test_waiting_openmp_threads_sleep_unless_the_user_chose_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert child_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert child_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_output_is_unbuffered_and_a_service_s_own_variables_win(monkeypatch):
    monkeypatch.setenv("PYTHONUNBUFFERED", "0")
    env = child_env({"ASYNCRL_TOKEN": "t", "OMP_WAIT_POLICY": "ACTIVE"})
    assert env["PYTHONUNBUFFERED"] == "1" and env["ASYNCRL_TOKEN"] == "t" and env["OMP_WAIT_POLICY"] == "ACTIVE"
