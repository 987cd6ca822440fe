"""docs/results.md is generated from docs/results/*.json (no number typed by hand), a result names the CPU
generation it ran on, and the annotation request/reply mapping of a replica's teacher call."""

from __future__ import annotations

import json

import pytest

from asyncrl.tools.bench_report import REPORT, flatten, render
from asyncrl.v1 import teacher_pb2, trajectory_pb2


def test_results_md_is_generated_from_the_result_files():
    assert REPORT.read_text() == render(), "regenerate: asyncrl bench --report"


def test_a_result_is_shown_with_its_command_and_machine(tmp_path):
    (tmp_path / "results").mkdir()
    result = {"speedup": 2.3456, "eta0": {"wall_per_step_s": 0.2}, "series": [1, 2],
              "provenance": {"command": ".venv/bin/python bench/x.py --steps 5", "date": "2026-11-24",
                             "machine": {"arch": "x86_64", "cpus": 2}}}
    (tmp_path / "results" / "x.json").write_text(json.dumps(result))
    page = render(tmp_path / "results")
    assert "`.venv/bin/python bench/x.py --steps 5` (2026-11-24; arch x86_64, cpus 2)" in page
    assert "| `speedup` | 2.346 |" in page and "| `eta0.wall_per_step_s` | 0.2 |" in page
    assert "| `series` | [1, 2] |" in page and "provenance" not in page.split("`.venv")[1]
    assert flatten({"a": [{"b": 1}]}) == [("a[0].b", 1)]


def test_score_request_and_reply_map_to_the_trajectories():
    from asyncrl.rollout.annotation import fill_logp_teacher, request_for

    first = trajectory_pb2.TrajectoryGroup(trajectories=[
        trajectory_pb2.Trajectory(trajectory_id="a", prompt_token_ids=[1, 2], response_token_ids=[3, 4, 5])])
    second = trajectory_pb2.TrajectoryGroup(trajectories=[
        trajectory_pb2.Trajectory(trajectory_id="b", prompt_token_ids=[1, 2], response_token_ids=[6])])
    groups = [first, second]  # one request for the groups of a generation batch, in order
    request = request_for(groups)
    assert [(list(s.token_ids), s.response_start) for s in request.sequences] == [([1, 2, 3, 4, 5], 2), ([1, 2, 6], 2)]
    reply = teacher_pb2.ScoreResponse(sequences=[teacher_pb2.ScoredSequence(logp_teacher=[-1.0, -2.0, -3.0]),
                                                 teacher_pb2.ScoredSequence(logp_teacher=[-0.5])])
    fill_logp_teacher(groups, reply)
    assert [list(t.logp_teacher) for g in groups for t in g.trajectories] == [[-1.0, -2.0, -3.0], [-0.5]]
    short = teacher_pb2.ScoreResponse(sequences=[teacher_pb2.ScoredSequence(logp_teacher=[-1.0]),
                                                 teacher_pb2.ScoredSequence(logp_teacher=[-0.5])])
    with pytest.raises(ValueError, match="1 teacher log-probs for 3 tokens"):
        fill_logp_teacher(groups, short)
    assert [list(t.logp_teacher) for g in groups for t in g.trajectories] == [[-1.0, -2.0, -3.0], [-0.5]]  # untouched


def test_a_result_names_the_cpu_generation_behind_a_bare_model_name(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).parents[2] / "bench" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: avx2\n")
    assert common.cpu_description(cpuinfo) == "AMD EPYC (family 25 model 17, AVX-512)"
    cpuinfo.write_text("model name\t: Some CPU\nflags\t\t: sse avx2\n")
    assert common.cpu_description(cpuinfo) == "Some CPU (AVX2)"
    assert common.cpu_description(tmp_path / "absent") == ""
