"""The rollout, teacher and learner gRPC edges over real gRPC (in-process servers on port 0) around real
torch engines on the tiny checkpoint: health, reflection, /metrics, INVALID_ARGUMENT naming the bad field,
and a real gloo weight push into a rollout replica through its UpdateWeights RPC."""

from __future__ import annotations

import socket
import threading
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from asyncrl.core.model.modeling import load_causal_lm, named_weights, sequence_logprobs
from asyncrl.core.runtime.metrics import serve_metrics
from asyncrl.core.wire.auth import new_push_key, push_order_mac
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.learner.progress import LearnerProgress
from asyncrl.push.broadcast import host_store, make_group
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import send_weights
from asyncrl.services import learner_service, rollout_service, teacher_service
from asyncrl.v1 import (
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    teacher_pb2,
    teacher_pb2_grpc,
)
from tests.conftest import TEST_AUTH, TEST_STORE_KEY

pytestmark = pytest.mark.integration


def local_config(tiny_model_dir):
    cfg = tiny_model_dir.config.model_copy(deep=True)
    for section in (cfg.rollout, cfg.teacher, cfg.learner):
        section.port = 0
        section.metrics_port = 0
    return cfg


@pytest.fixture
def started(request):
    """Start a (server, port) pair and return a channel to it; stopped after the test."""
    servers = []

    def start(server_and_port):
        server, port = server_and_port
        server.start()
        channel = grpc_channel(f"127.0.0.1:{port}", TEST_AUTH)
        servers.append((server, channel))
        return server, channel

    yield start
    for server, channel in servers:
        channel.close()
        server.stop(0).wait()


def invalid(call, request, field: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith(field + ":"), info.value.details()
    return info.value.details()


def assert_healthy_and_reflected(channel, service: str) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for name in (service, ""):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert {service, "grpc.health.v1.Health"} <= names


def scrape(registry) -> str:
    port = serve_metrics("127.0.0.1", 0, registry)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        return reply.read().decode()


# -- rollout --------------------------------------------------------------------------------------------


def test_rollout_generate_health_metrics_and_validation(tiny_model_dir, started):
    server, channel = started(rollout_service.create_server(local_config(tiny_model_dir)))
    assert_healthy_and_reflected(channel, rollout_service.SERVICE)
    stub = rollout_pb2_grpc.RolloutStub(channel)
    prompt = rollout_pb2.PromptTokens(token_ids=[1, 5, 6, 7])
    reply = stub.Generate(rollout_pb2.GenerateRequest(prompts=[prompt, prompt], max_new_tokens=4, temperature=1.0))
    assert len(reply.sequences) == 2
    for seq in reply.sequences:
        assert 1 <= len(seq.token_ids) <= 4
        assert len(seq.logp_behav) == len(seq.weight_version) == len(seq.token_ids)
        assert all(lp <= 0 for lp in seq.logp_behav) and set(seq.weight_version) == {0}
    status = stub.GetStatus(rollout_pb2.RolloutStatusRequest())
    assert status.engine == "torch" and status.weight_version == 0

    vocab = server.servicer.vocab_size
    invalid(stub.Generate, rollout_pb2.GenerateRequest(max_new_tokens=4), "prompts")
    invalid(stub.Generate, rollout_pb2.GenerateRequest(prompts=[rollout_pb2.PromptTokens()], max_new_tokens=4),
            "prompts[0].token_ids")
    bad_token = rollout_pb2.PromptTokens(token_ids=[1, vocab + 3])
    assert str(vocab + 3) in invalid(stub.Generate, rollout_pb2.GenerateRequest(prompts=[prompt, bad_token],
                                                                                max_new_tokens=4),
                                     "prompts[1].token_ids")
    invalid(stub.Generate, rollout_pb2.GenerateRequest(prompts=[prompt]), "max_new_tokens")
    invalid(stub.Generate, rollout_pb2.GenerateRequest(prompts=[prompt], max_new_tokens=2, temperature=-1),
            "temperature")
    invalid(stub.UpdateWeights, rollout_pb2.UpdateWeightsRequest(), "plan")
    plan = PushPlan(push_id="p1", version=1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, world_size=2, transport="gloo", tensors=tensor_metas([("x", torch.zeros(2))]), bucket_bytes=1024, timeout_s=5)
    invalid(stub.UpdateWeights, rollout_pb2.UpdateWeightsRequest(plan=plan.to_proto(), rank=0), "rank")
    bad_transport = plan.to_proto()
    bad_transport.transport = "carrier-pigeon"
    invalid(stub.UpdateWeights, rollout_pb2.UpdateWeightsRequest(plan=bad_transport, rank=1), "plan.transport")
    # A request that was refused did not disturb the replica: it still generates at version 0.
    again = stub.Generate(rollout_pb2.GenerateRequest(prompts=[prompt], max_new_tokens=2)).sequences[0]
    assert len(again.token_ids) >= 1 and set(again.weight_version) == {0}

    text = scrape(server.servicer.metrics.registry)
    assert f"asyncrl_rollout_weight_version{{replica=\"{socket.gethostname()}\"}} 0.0" in text  # not registered: host name
    assert "asyncrl_rollout_generation_seconds_bucket" in text


def test_rollout_update_weights_installs_the_learner_weights(tiny_model_dir, started):
    """A real gloo push in small buckets (many of them, so staging buffers are reused) over UpdateWeights:
    afterwards the replica's log-probs for fixed tokens equal those of the sender's perturbed model. Only a
    push signed with the replica's push key (its controller's order) is taken: unsigned, wrongly signed or
    re-targeted orders are PERMISSION_DENIED and change nothing."""
    config = local_config(tiny_model_dir)
    key = new_push_key()
    server, channel = started(rollout_service.create_server(config, push_key=lambda: key))
    stub = rollout_pb2_grpc.RolloutStub(channel)
    learner = load_causal_lm(tiny_model_dir.policy)
    with torch.no_grad():
        for _, p in learner.named_parameters():
            p.add_(0.05 * torch.randn_like(p))
    named = named_weights(learner)
    store = host_store("127.0.0.1", 0, 30)
    plan = PushPlan(push_id="push-7", version=7, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named), bucket_bytes=64 * 1024, timeout_s=30)

    def order(signing_key: bytes, rank: int) -> bytes:
        return push_order_mac(signing_key, plan, rank)

    for mac in [b"", order(new_push_key(), 1), order(key, 2), order(key, 1)[:-1] + b"\x00"]:
        with pytest.raises(grpc.RpcError) as refused:
            stub.UpdateWeights(rollout_pb2.UpdateWeightsRequest(plan=plan.to_proto(), rank=1, order_mac=mac),
                               timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    assert stub.GetStatus(rollout_pb2.RolloutStatusRequest()).weight_version == 0
    replies = {}
    receiver = threading.Thread(target=lambda: replies.update(r=stub.UpdateWeights(
        rollout_pb2.UpdateWeightsRequest(plan=plan.to_proto(), rank=1, order_mac=order(key, 1)), timeout=60)))
    receiver.start()
    assert send_weights(make_group(plan, 0, store), named, plan) == plan.total_bytes
    receiver.join(60)
    assert replies["r"].weight_version == 7 and replies["r"].load_s > 0

    engine = server.servicer.engine
    seqs, starts = [[1, 5, 6, 7, 8, 9, 2], [1, 9, 9, 4, 3]], [4, 3]
    expected, _ = sequence_logprobs(learner.eval(), seqs, starts, None, pad_id=0)
    got = engine.score(seqs, starts)
    for row, (seq, start) in enumerate(zip(seqs, starts)):
        assert torch.allclose(torch.tensor(got[row]), expected[row, : len(seq) - start], atol=1e-5)
    status = stub.GetStatus(rollout_pb2.RolloutStatusRequest())
    assert status.weight_version == 7
    gen = stub.Generate(rollout_pb2.GenerateRequest(prompts=[rollout_pb2.PromptTokens(token_ids=[1, 5])],
                                                    max_new_tokens=2))
    assert set(gen.sequences[0].weight_version) == {7}


def test_a_liveness_answer_is_never_a_signed_push_order(tiny_model_dir, started):
    """A token holder asks the replica to answer a liveness challenge chosen so that the answered text is a
    push order's text (push id "alive", the rest of the order as the challenge), then presents the answer as
    the order's signature. Every text signed under the push key starts with its own word, so the replica
    refuses the forged order (before, the two texts were the same bytes and the order was taken)."""
    config = local_config(tiny_model_dir)
    key = new_push_key()
    _server, channel = started(rollout_service.create_server(config, push_key=lambda: key))
    stub = rollout_pb2_grpc.RolloutStub(channel)
    plan = PushPlan(push_id="alive", version=1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, world_size=2, transport="gloo",
                    tensors=tensor_metas([("x", torch.zeros(2))]), bucket_bytes=1024, timeout_s=5)
    fields = [plan.version, 1, plan.world_size, plan.store_address, plan.transport, plan.group_id, 1,
              plan.manifest_digest]
    for challenge in ("\n".join(map(str, fields)).encode(), "\n".join(["alive", *map(str, fields)]).encode()):
        assert len(challenge) <= 64
        answer = stub.GetStatus(rollout_pb2.RolloutStatusRequest(challenge=challenge)).challenge_mac
        assert answer and answer != push_order_mac(key, plan, 1)
        with pytest.raises(grpc.RpcError) as refused:
            stub.UpdateWeights(rollout_pb2.UpdateWeightsRequest(plan=plan.to_proto(), rank=1, order_mac=answer),
                               timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    assert stub.GetStatus(rollout_pb2.RolloutStatusRequest()).weight_version == 0


def test_rollout_refuses_a_plan_that_does_not_fit_the_model(tiny_model_dir, started):
    """A plan naming tensors the model lacks is INVALID_ARGUMENT; the sender is not left hanging and the
    replica keeps its weights and version."""
    _server, channel = started(rollout_service.create_server(local_config(tiny_model_dir)))
    stub = rollout_pb2_grpc.RolloutStub(channel)
    named = [("model.not_a_layer.weight", torch.ones(3, 3))]
    store = host_store("127.0.0.1", 0, 30)
    plan = PushPlan(push_id="push-x", version=1, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=2, transport="gloo", tensors=tensor_metas(named), bucket_bytes=1024, timeout_s=30)
    errors = {}

    def call():
        try:
            stub.UpdateWeights(rollout_pb2.UpdateWeightsRequest(plan=plan.to_proto(), rank=1), timeout=60)
        except grpc.RpcError as err:
            errors["e"] = err

    receiver = threading.Thread(target=call)
    receiver.start()
    send_weights(make_group(plan, 0, store), named, plan)  # returns: the replica drained the broadcast
    receiver.join(60)
    assert errors["e"].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors["e"].details().startswith("plan:") and "model.not_a_layer.weight" in errors["e"].details()
    assert stub.GetStatus(rollout_pb2.RolloutStatusRequest()).weight_version == 0


# -- teacher --------------------------------------------------------------------------------------------


def test_teacher_scores_response_tokens_and_validates(tiny_model_dir, started):
    server, channel = started(teacher_service.create_server(local_config(tiny_model_dir)))
    assert_healthy_and_reflected(channel, teacher_service.SERVICE)
    stub = teacher_pb2_grpc.TeacherStub(channel)
    seqs, starts = [[1, 5, 6, 7, 8, 9, 2], [1, 9, 9, 4, 3]], [4, 3]
    reply = stub.Score(teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=s, response_start=r) for s, r in zip(seqs, starts)]))
    teacher = load_causal_lm(tiny_model_dir.teacher).eval()
    expected, _ = sequence_logprobs(teacher, seqs, starts, None, pad_id=0)
    for row, (seq, start) in enumerate(zip(seqs, starts)):
        got = torch.tensor(list(reply.sequences[row].logp_teacher))
        assert got.shape[0] == len(seq) - start
        assert torch.allclose(got, expected[row, : len(seq) - start], atol=1e-5)

    invalid(stub.Score, teacher_pb2.ScoreRequest(), "sequences")
    invalid(stub.Score, teacher_pb2.ScoreRequest(sequences=[teacher_pb2.ScoreSequence(response_start=1)]),
            "sequences[0].token_ids")
    invalid(stub.Score, teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=[1, 2, 3], response_start=2),
        teacher_pb2.ScoreSequence(token_ids=[1, 2, 3], response_start=0)]), "sequences[1].response_start")
    invalid(stub.Score, teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=[1, 2, 3], response_start=4)]), "sequences[0].response_start")
    invalid(stub.Score, teacher_pb2.ScoreRequest(sequences=[
        teacher_pb2.ScoreSequence(token_ids=[1, -2 % 2**31, 3], response_start=1)]), "sequences[0].token_ids")

    text = scrape(server.servicer.scorer.metrics.registry)
    assert "asyncrl_teacher_sequences_scored_total 2.0" in text
    assert "asyncrl_teacher_tokens_scored_total 5.0" in text


# -- learner --------------------------------------------------------------------------------------------


def test_learner_status_health_and_metrics(tiny_model_dir, started):
    progress = LearnerProgress(step=3, version=3, consumed=192, step_figures={"reward_mean": 0.25}, last_eval_accuracy=0.4)
    _server, channel = started(learner_service.create_server(local_config(tiny_model_dir), progress))
    assert_healthy_and_reflected(channel, learner_service.SERVICE)
    status = learner_pb2_grpc.LearnerStub(channel).GetStatus(learner_pb2.LearnerStatusRequest())
    assert (status.step, status.version, status.consumed) == (3, 3, 192)
    assert status.last_eval_accuracy == pytest.approx(0.4)
    metrics = LearnerMetrics()
    metrics.eval_accuracy.set(0.4)
    assert "asyncrl_learner_eval_accuracy 0.4" in scrape(metrics.registry)
