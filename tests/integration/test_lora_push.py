"""Adapter-only pushes over real gRPC and gloo to torch-engine replicas: only the adapter travels, the replicas
serve exactly what the learner's adapted policy computes (merged onto the base, never onto the previous merge),
every commit checks the checksum each replica serves, and a replica whose engine did not take the adapter is
dropped from the push and resynced, not counted as holding the version."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.model.modeling import load_causal_lm, named_weights
from asyncrl.core.runtime.events import read_events
from asyncrl.learner.adapters import inject_adapters, lora_parameters
from asyncrl.push.sender import WeightPublisher
from asyncrl.v1 import controller_pb2
from tests.integration.test_background_push import model_logprobs, push_system, replica_logprobs

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def adapter_publisher(config, stub, model, spec):
    publisher = WeightPublisher(stub, model, config.learner.weight_transport, config.controller.push_timeout_s,
                                named=lora_parameters(model), adapter=spec)
    try:
        yield publisher
    finally:
        publisher.close()


def adapted_learner(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir.policy)
    spec = inject_adapters(model, SimpleNamespace(rank=4, alpha=8.0, dropout=0.0,
                                                  target_modules=["q_proj", "v_proj", "down_proj"]))
    return model, spec


@torch.no_grad()
def perturb(model, seed: int, std: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    for _, p in lora_parameters(model):
        p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.mark.parametrize("in_band", [False, True], ids=["ordered", "in-band"])
def test_only_the_adapter_travels_and_every_replica_serves_the_adapted_policy(tiny_model_dir, tmp_path, in_band):
    with push_system(tiny_model_dir, tmp_path, in_band=in_band) as (config, stub, engines, _replicas, _):
        learner, spec = adapted_learner(tiny_model_dir)
        base = model_logprobs(load_causal_lm(tiny_model_dir.policy))
        full_bytes = sum(t.numel() * t.element_size() for _, t in named_weights(load_causal_lm(tiny_model_dir.policy)))
        with adapter_publisher(config, stub, learner, spec) as publisher:
            for version, seed in ((1, 1), (2, 2), (3, None)):
                if seed is None:
                    with torch.no_grad():  # B = 0: the adapted policy is the base again
                        for name, p in lora_parameters(learner):
                            p.zero_() if ".lora_B." in name else None
                else:
                    perturb(learner, seed)
                result = publisher.push(version)
                assert result.committed and len(result.acked) == 2 and not result.dropped
                adapter_bytes = sum(p.numel() * p.element_size() for _, p in lora_parameters(learner))
                assert result.bytes_sent == adapter_bytes < full_bytes / 20
                want = model_logprobs(learner)
                checksum = weights_checksum(lora_parameters(learner))
                for engine in engines:
                    assert engine.weight_version == version and engine.adapter_checksum == checksum
                    assert torch.allclose(replica_logprobs(engine), want, atol=1e-5)
            # Merged onto the base each time, not onto the last merge: B = 0 gives the base back exactly.
            assert torch.allclose(replica_logprobs(engines[0]), base, atol=1e-6)
            assert result.in_band == in_band
        # The controller shows what each replica serves, held against what the learner pushed.
        status = stub.GetStatus(controller_pb2.GetStatusRequest(), timeout=10)
        assert [(r.adapter_checksum, r.adapter_verified) for r in status.replicas] == [(checksum, True)] * 2


def test_a_replica_whose_engine_did_not_take_the_adapter_is_dropped_and_resynced(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    with push_system(tiny_model_dir, tmp_path, in_band=False) as (config, stub, engines, _replicas, _):
        learner, spec = adapted_learner(tiny_model_dir)
        perturb(learner, 1)
        # The failure peers saw for weeks: the update "succeeds" but the engine keeps serving what it had.
        silent = engines[1]
        original = silent._update_adapter

        def no_op(plan, rank):
            stats = original(plan, rank)
            silent._adapter.checksum = ""
            stats.adapter_checksum = ""
            return stats

        monkeypatch.setattr(silent, "_update_adapter", no_op)
        with adapter_publisher(config, stub, learner, spec) as publisher:
            result = publisher.push(1)
            assert result.committed and len(result.acked) == 1 and len(result.dropped) == 1
            dropped = [e for e in read_events(tmp_path, "controller") if e["kind"] == "replica_dropped"]
            assert [e["replica_id"] for e in dropped] == result.dropped
            assert "did not take effect" in dropped[0]["error"]
            status = {r.replica_id: r for r in stub.GetStatus(controller_pb2.GetStatusRequest(), timeout=10).replicas}
            assert status[result.dropped[0]].needs_sync and not status[result.dropped[0]].adapter_verified
            assert status[result.acked[0]].adapter_verified
            monkeypatch.setattr(silent, "_update_adapter", original)
            # The next push reaches it again (it needs a resync) and it serves the right adapter from then on.
            perturb(learner, 2)
            second = publisher.push(2)
            assert second.committed and len(second.acked) == 2
            assert silent.adapter_checksum == weights_checksum(lora_parameters(learner))
