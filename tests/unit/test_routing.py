"""MoE routing capture, forced routing and the wire format (`asyncrl.core.model.routing`), on a one-layer Qwen3-MoE
built here: forcing reproduces the given experts exactly with gates recomputed from the current router logits,
the torch engine's captured routing replays to its own log-probs, and gradients still reach the router."""

import numpy as np
import pytest
import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.model.modeling import sequence_logprobs
from asyncrl.core.model.routing import (
    RoutedExperts,
    UnsupportedRouter,
    find_routers,
    install_hooks,
    read_proto,
    routing_mismatch,
    routing_shape,
    write_proto,
)
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.v1 import trajectory_pb2

NUM_EXPERTS, TOP_K = 8, 2


def tiny_moe(layers=1, seed=0, norm_topk_prob=True):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=32, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=1, num_key_value_heads=1, head_dim=64, num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K, max_position_embeddings=64, initializer_range=0.3,
        norm_topk_prob=norm_topk_prob, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config).float().eval()


def spy_expert_inputs(model):
    """Records (top_k_index, top_k_weights) each experts module receives, per layer."""
    seen = {}
    for layer, block in enumerate(model.model.layers):
        def hook(module, args, layer=layer):
            seen[layer] = (args[1].clone(), args[2].detach().clone())
        block.mlp.experts.register_forward_pre_hook(hook)
    return seen


def padded(routed: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(routed), width, *routed[0].shape[1:], dtype=torch.long)
    mask = torch.zeros(len(routed), width, dtype=torch.bool)
    for i, r in enumerate(routed):
        ids[i, : len(r)] = torch.from_numpy(r.astype(np.int64))
        mask[i, : len(r)] = True
    return ids, mask


def test_shape_and_dense_models():
    model = tiny_moe(layers=2)
    shape = routing_shape(model)
    assert (shape.num_layers, shape.top_k, shape.num_experts) == (2, TOP_K, NUM_EXPERTS)
    assert shape.bytes_per_token == 2 * TOP_K  # one byte per id
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dense = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    assert find_routers(dense) == [] and routing_shape(dense) is None and install_hooks(dense) is None


def test_an_unknown_router_is_refused():
    class OddTopKRouter(torch.nn.Module):
        top_k = 2

    with pytest.raises(UnsupportedRouter, match="OddTopKRouter"):
        find_routers(torch.nn.Sequential(OddTopKRouter()))


def test_forced_routing_uses_exactly_the_given_experts_with_gates_from_current_logits():
    model = tiny_moe()
    hooks = install_hooks(model)
    seen = spy_expert_inputs(model)
    ids = torch.tensor([[2, 5, 9, 11, 3]])
    forced = torch.randint(0, NUM_EXPERTS, (1, 5, 1, TOP_K), generator=torch.Generator().manual_seed(1))
    forced[..., 1] = (forced[..., 0] + 1 + torch.arange(5).view(1, 5, 1) % 3) % NUM_EXPERTS  # distinct pairs
    router = model.model.layers[0].mlp.gate
    captured_input = {}
    router.register_forward_pre_hook(lambda m, args: captured_input.setdefault("h", args[0].detach().clone()))
    with torch.no_grad(), hooks.force(forced):
        model(input_ids=ids)
    chosen, gates = seen[0]
    assert torch.equal(chosen, forced.view(5, TOP_K))
    # Hand computation: softmax over the current router logits, picked at the forced experts, renormalised.
    logits = captured_input["h"].view(-1, 64) @ router.weight.T
    probs = torch.softmax(logits.float(), dim=-1).gather(-1, forced.view(5, TOP_K))
    assert torch.allclose(gates, probs / probs.sum(-1, keepdim=True), atol=1e-6)


def test_forcing_the_natural_routing_changes_nothing_and_the_mask_leaves_positions_free():
    model = tiny_moe(layers=2)
    hooks = install_hooks(model)
    ids = torch.tensor([[2, 5, 9, 11, 3, 7]])
    with torch.no_grad(), hooks.capture() as natural:
        reference = model(input_ids=ids).logits
    own = torch.stack(natural, dim=-2).view(1, 6, 2, TOP_K)
    with torch.no_grad(), hooks.force(own):
        assert torch.equal(model(input_ids=ids).logits, reference)
    # Forcing other experts changes the output, except where the mask leaves the router free.
    other = (own + 3) % NUM_EXPERTS
    with torch.no_grad(), hooks.force(other):
        assert not torch.allclose(model(input_ids=ids).logits, reference)
    with torch.no_grad(), hooks.force(other, torch.zeros(1, 6, dtype=torch.bool)):
        assert torch.equal(model(input_ids=ids).logits, reference)


def test_forced_ids_must_align_with_the_forward():
    model = tiny_moe()
    hooks = install_hooks(model)
    with pytest.raises(ValueError, match="must be"), hooks.force(torch.zeros(1, 4, 2, TOP_K, dtype=torch.long)):
        pass
    misaligned = torch.zeros(1, 4, 1, TOP_K, dtype=torch.long)
    with pytest.raises(RuntimeError, match="aligned"), torch.no_grad(), hooks.force(misaligned):
        model(input_ids=torch.tensor([[2, 5, 9]]))


def test_gradients_reach_the_router_under_replay():
    model = tiny_moe(layers=2).train()
    hooks = install_hooks(model)
    ids = torch.tensor([[2, 5, 9, 11, 3, 7]])
    forced = torch.stack([torch.tensor([0, 1]), torch.tensor([2, 3])]).expand(1, 6, 2, TOP_K)
    with hooks.force(forced):
        logp, mask = sequence_logprobs(model, ids.tolist(), [2])
        (-logp[mask].sum()).backward()
    for layer in model.model.layers:
        assert layer.mlp.gate.weight.grad is not None and layer.mlp.gate.weight.grad.abs().sum() > 0
        # Only the forced experts ran: the others got no gradient.
        grads = layer.mlp.experts.down_proj.grad.abs().sum(dim=(1, 2))
        assert (grads[4:] == 0).all() and (grads[:4] > 0).any()


def test_engine_routing_replays_to_the_engine_log_probs_after_the_router_moved():
    """The rollout's captured experts, forced in the learner's forward with the same weights, give the
    engine's log-probs to float tolerance. After the router drifts (a later version), the learner's own
    routing differs from the rollout's on some tokens and replay brings the log-probs back closer."""
    model = tiny_moe(layers=2)
    hooks = install_hooks(model)
    prompts = [[2, 5, 6, 7], [2, 9], [2, 4, 4]]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    gens = [g for row in generate_with_model(model, prompts, params, 4, eos_ids=[1], pad_id=0,
                                             generator=torch.Generator().manual_seed(0), router_hooks=hooks)
            for g in row]
    prompt_of = [p for p in prompts for _ in range(4)]
    sequences = [p + g.token_ids for p, g in zip(prompt_of, gens)]
    starts = [len(p) for p in prompt_of]
    for seq, g in zip(sequences, gens):
        assert g.routed_experts.ids.shape == (len(seq) - 1, 2, TOP_K)
        assert g.routed_experts.ids.dtype == np.uint8 and g.routed_experts.num_experts == NUM_EXPERTS
    forced, mask = padded([g.routed_experts.ids for g in gens], max(len(s) for s in sequences))
    behav = torch.zeros(len(gens), params.max_new_tokens)
    for i, g in enumerate(gens):
        behav[i, : len(g.logp_behav)] = torch.tensor(g.logp_behav)

    def replayed():
        with torch.no_grad(), hooks.force(forced, mask):
            return sequence_logprobs(model, sequences, starts, params)

    logp, resp_mask = replayed()
    assert torch.allclose(logp[resp_mask], behav[:, : logp.shape[1]][resp_mask], atol=1e-5)

    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.add_(0.2 * torch.randn_like(layer.mlp.gate.weight))
    with torch.no_grad(), hooks.capture() as natural:
        own_logp, _ = sequence_logprobs(model, sequences, starts, params)
    own = torch.stack(natural, dim=-2).view(len(gens), -1, 2, TOP_K)
    assert routing_mismatch(own, forced, mask).max() > 0
    replayed_logp, _ = replayed()
    target = behav[:, : logp.shape[1]][resp_mask]
    assert (replayed_logp[resp_mask] - target).abs().mean() < (own_logp[resp_mask] - target).abs().mean()


def test_wire_format_round_trip_and_widths():
    ids = np.random.default_rng(0).integers(0, NUM_EXPERTS, size=(7, 3, TOP_K))
    msg = trajectory_pb2.RoutedExperts()
    write_proto(RoutedExperts(ids, NUM_EXPERTS), msg)
    assert (msg.num_tokens, msg.num_layers, msg.top_k, msg.num_experts) == (7, 3, TOP_K, NUM_EXPERTS)
    assert len(msg.expert_ids) == 7 * 3 * TOP_K  # one byte per id
    assert np.array_equal(read_proto(msg).ids, ids)
    # Beyond 256 experts: two bytes per id, little-endian.
    wide = np.array([[[300, 5]]])
    write_proto(RoutedExperts(wide, 384), msg)
    assert msg.expert_ids == bytes([44, 1, 5, 0]) and np.array_equal(read_proto(msg).ids, wide)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda m: setattr(m, "expert_ids", m.expert_ids[:-1]), "expert_ids"),
        (lambda m: setattr(m, "num_experts", 0), "num_experts"),
        (lambda m: setattr(m, "num_experts", 3), "expert_ids"),
        (lambda m: setattr(m, "top_k", 0), "top_k"),
    ],
)
def test_bad_wire_data_names_the_field(change, field):
    msg = trajectory_pb2.RoutedExperts()
    write_proto(RoutedExperts(np.array([[[0, 7]], [[6, 5]]]), NUM_EXPERTS), msg)
    change(msg)
    with pytest.raises(ValueError, match=field):
        read_proto(msg)


def test_write_refuses_ids_outside_the_experts():
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        write_proto(RoutedExperts(np.array([[[0, 8]]]), NUM_EXPERTS), trajectory_pb2.RoutedExperts())


def test_mismatch_fraction_by_hand():
    # 2 tokens x 2 layers x top-2; sets compared, order ignored.
    learner = torch.tensor([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]])
    rollout = torch.tensor([[[[1, 0], [2, 4]], [[4, 5], [7, 0]]]])
    assert routing_mismatch(learner, rollout, torch.ones(1, 2, dtype=torch.bool)).tolist() == [0.0, 1.0]
    # The second token masked out: layer 1 differs on 1 of 1.
    assert routing_mismatch(learner, rollout, torch.tensor([[True, False]])).tolist() == [0.0, 1.0]
    assert routing_mismatch(learner, rollout, torch.tensor([[False, True]])).tolist() == [0.0, 1.0]
    same = routing_mismatch(learner, learner, torch.ones(1, 2, dtype=torch.bool))
    assert same.tolist() == [0.0, 0.0]
