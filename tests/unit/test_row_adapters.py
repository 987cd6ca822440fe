"""Several adapters in one batch (`asyncrl.core.lora.row_adapters`): each row of a mixed batch computes what its
adapter merged into the base computes alone, in a forward and in seeded sampling; rows of the base slot get the
base exactly; a load that does not fit is refused naming what, and leaves the slot as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.lora.merge import merged_weight
from asyncrl.core.lora.row_adapters import BASE_SLOT, AdapterBank
from asyncrl.core.lora.spec import AdapterSpec, adapter_name
from asyncrl.core.model.sampling import SamplingParams

PAD, EOS = 0, 2
TARGETS = ("q_proj", "v_proj", "down_proj")


@pytest.fixture(scope="module")
def base():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=24, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=64,
                      pad_token_id=PAD, eos_token_id=EOS)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def random_adapter(model, spec: AdapterSpec, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and any(name.endswith("." + t) for t in spec.target_modules):
            out[adapter_name(name, "A")] = torch.randn(spec.rank, module.in_features, generator=gen) * 0.3
            out[adapter_name(name, "B")] = torch.randn(module.out_features, spec.rank, generator=gen) * 0.3
    return out


def merged(model, spec: AdapterSpec, tensors) -> torch.nn.Module:
    alone = copy.deepcopy(model)
    for name, module in alone.named_modules():
        a = tensors.get(adapter_name(name, "A"))
        if a is not None:
            module.weight.data = merged_weight(module.weight.data, a, tensors[adapter_name(name, "B")], spec.scale)
    return alone


ADAPTERS = [AdapterSpec(4, 8.0, TARGETS), AdapterSpec(8, 8.0, TARGETS), AdapterSpec(2, 4.0, ("v_proj",))]


@pytest.fixture(scope="module")
def served(base):
    """(model with a bank, [(slot, spec, tensors)]): three adapters of other ranks and targets in slots 1-3."""
    model = copy.deepcopy(base)
    bank = AdapterBank(model, TARGETS, slots=4, max_rank=8)
    loaded = []
    for slot, spec in enumerate(ADAPTERS, start=1):
        tensors = random_adapter(base, spec, seed=slot)
        bank.load(slot, spec, tensors)
        loaded.append((slot, spec, tensors))
    return model, bank, loaded


@torch.no_grad()
def test_each_row_of_a_mixed_batch_computes_what_its_adapter_merged_computes_alone(base, served):
    model, bank, loaded = served
    ids = torch.randint(3, 24, (8, 6), generator=torch.Generator().manual_seed(0))
    slots = [1, 2, BASE_SLOT, 3, 1, 3, 2, BASE_SLOT]
    with bank.rows(slots):
        mixed = model(input_ids=ids).logits
    references = {BASE_SLOT: base} | {slot: merged(base, spec, tensors) for slot, spec, tensors in loaded}
    for row, slot in enumerate(slots):
        alone = references[slot](input_ids=ids[row : row + 1]).logits[0]
        torch.testing.assert_close(mixed[row], alone, atol=2e-5, rtol=1e-5)
    # The adapters differ from each other and from the base, so a row through the wrong one would show.
    assert (mixed[0] - mixed[1]).abs().max() > 0.1 and (mixed[0] - mixed[2]).abs().max() > 0.1


@torch.no_grad()
def test_rows_of_the_base_slot_and_of_an_empty_one_get_the_base_bit_for_bit(base, served):
    model, bank, _ = served
    ids = torch.randint(3, 24, (3, 5), generator=torch.Generator().manual_seed(1))
    expected = base(input_ids=ids).logits
    with bank.rows([BASE_SLOT] * 3):
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert torch.equal(model(input_ids=ids).logits, expected)  # outside `rows`: the base
    with bank.rows([4, 4, 4]):  # slot 4 was never loaded
        assert torch.equal(model(input_ids=ids).logits, expected)


def test_seeded_sampling_in_a_mixed_batch_draws_what_each_adapter_draws_alone(base, served):
    model, bank, loaded = served
    prompts = [[1, 5, 6, 7], [1, 9, 4], [1, 5, 6, 7], [1, 11, 12, 3, 8], [1, 9, 4]]
    slots = [1, 2, 2, 3, 1]  # the same prompt under two adapters: prefilled once per adapter
    seeds = [10, 11, 12, 13, 14]
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    common = {"eos_ids": [EOS], "pad_id": PAD, "n": 2}
    mixed = generate_with_model(model, prompts, params, seeds=seeds, bank=bank, adapter_slots=slots, **common)
    for slot, spec, tensors in loaded:
        rows = [i for i, s in enumerate(slots) if s == slot]
        alone = generate_with_model(merged(base, spec, tensors), [prompts[i] for i in rows], params,
                                    seeds=[seeds[i] for i in rows], **common)
        for i, gens in zip(rows, alone):
            for got, want in zip(mixed[i], gens):
                assert got.token_ids == want.token_ids
                assert got.logp_behav == pytest.approx(want.logp_behav, abs=1e-4)


def test_a_load_that_does_not_fit_is_refused_and_leaves_the_slot_as_it_was(base, served):
    model, bank, loaded = served
    slot, spec, tensors = loaded[0]
    ids = torch.tensor([[1, 5, 6]])
    with torch.no_grad(), bank.rows([slot]):
        before = model(input_ids=ids).logits
    too_wide = AdapterSpec(16, 8.0, TARGETS)
    with pytest.raises(ValueError, match="rank 16 is above the bank's max_rank 8"):
        bank.load(slot, too_wide, random_adapter(base, too_wide, seed=9))
    wrong = dict(tensors)
    name = next(iter(wrong))
    wrong[name] = wrong[name][:, :-1]
    with pytest.raises(ValueError, match="has shape"):
        bank.load(slot, spec, wrong)
    with pytest.raises(ValueError, match="not among the adapter's target_modules"):
        bank.load(slot, AdapterSpec(4, 8.0, ("v_proj",)), tensors)
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"slot {bad} is not in"):
            bank.load(bad, spec, tensors)
    with torch.no_grad(), bank.rows([slot]):
        assert torch.equal(model(input_ids=ids).logits, before)


def test_a_bank_holds_its_slots_up_front():
    layer = torch.nn.Linear(12, 16)
    model = torch.nn.ModuleDict({"q_proj": layer})
    bank = AdapterBank(model, ("q_proj",), slots=3, max_rank=4)
    assert bank.bytes == 4 * 4 * (12 + 16) * 4  # (3 slots + the base's) x rank x (in + out) x float32
    with pytest.raises(ValueError, match="no linear module"):
        AdapterBank(torch.nn.ModuleDict({"x": torch.nn.Linear(2, 2)}), ("q_proj",), slots=1, max_rank=1)
