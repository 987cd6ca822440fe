"""`asyncrl up` with mutual TLS on every gRPC connection (security.tls_*): the demo trains and audits clean."""

from __future__ import annotations

import pytest

from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import asyncrl_up, no_process_left
from tests.tls_certs import make_pki

pytestmark = pytest.mark.e2e
STEPS = 12


def test_demo_over_mutual_tls(tmp_path):
    pki = make_pki(tmp_path / "pki")
    run_dir = tmp_path / "run"
    summary = asyncrl_up(run_dir, f"learner.total_steps={STEPS}", "learner.eval_every=0",
                         f"security.tls_cert_file={pki.cert}", f"security.tls_key_file={pki.key}",
                         f"security.tls_ca_file={pki.ca}", "security.tls_client_auth=true", timeout_s=600)
    assert summary["audit"]["ok"] and summary["audit"]["groups_trained"] == STEPS * 8, summary["audit"]
    pushes = [e for e in read_events(run_dir, "controller") if e["kind"] == "push_committed"]
    # Every version reached both replicas through Rollout.UpdateWeights, a TLS call from the controller.
    assert {e["version"] for e in pushes if len(e["acked"]) == 2} >= set(range(1, STEPS + 1)), pushes[-3:]
    assert "tls_cert_file" in (run_dir / "config.resolved.yaml").read_text()
    no_process_left(run_dir)
