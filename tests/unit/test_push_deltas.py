"""Sparse delta buckets (`push.deltas`): what changes travels, bit for bit, and a header that does not fit is
refused before anything is allocated for it."""

import pytest
import torch

from asyncrl.push import deltas
from asyncrl.push.deltas import DENSE, NO_BASE


def test_a_bucket_travels_as_its_changed_elements_and_comes_back_bit_for_bit():
    base = torch.zeros(100, dtype=torch.bfloat16)
    new = base.clone()
    new[[3, 40, 99]] = torch.tensor([1.5, -2.0, 7.0], dtype=torch.bfloat16)
    count, payload = deltas.encode(new, base)
    assert count == 3
    # 3 int32 indices (12 bytes) padded to 16, then 3 bfloat16 values.
    assert payload.numel() == 16 + 6 == deltas.payload_bytes(3, torch.bfloat16)
    indices, values = deltas.split(payload, 3, torch.bfloat16)
    assert indices.tolist() == [3, 40, 99]
    assert values.tolist() == [1.5, -2.0, 7.0]
    out = base.clone()
    deltas.apply(payload, count, out)
    assert torch.equal(out.view(torch.int16), new.view(torch.int16))


def test_elements_compare_by_their_bits():
    """-0.0 equals 0.0 as a number but is another bit pattern: it travels; a NaN that stays the same does not."""
    base = torch.tensor([0.0, float("nan"), 1.0, 2.0] * 8, dtype=torch.float32)
    new = base.clone()
    new[0] = -0.0
    count, payload = deltas.encode(new, base)
    assert count == 1
    out = base.clone()
    deltas.apply(payload, count, out)
    assert torch.equal(out.view(torch.int32), new.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.float16])
def test_every_element_size_round_trips(dtype):
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(1000, generator=g) * 100).to(dtype)
    new = base.clone()
    changed = torch.randperm(1000, generator=g)[:17]
    new[changed] += 1
    count, payload = deltas.encode(new, base)
    assert count == 17
    out = base.clone()
    deltas.apply(payload, count, out)
    assert torch.equal(out, new)


@pytest.mark.parametrize(("dtype", "numel", "offset"), [(torch.bfloat16, 4003, 0), (torch.bfloat16, 4003, 1),
                                                          (torch.uint8, 999, 0), (torch.float32, 1001, 0),
                                                          (torch.bfloat16, 3, 0)])
def test_the_changed_elements_are_found_word_by_word_exactly_as_element_by_element(dtype, numel, offset):
    """Narrow elements are compared 8 bytes at a time first: the same indices, a tail that fills no word and a
    view that does not start on a word included."""
    g = torch.Generator().manual_seed(numel)
    base = torch.randint(0, 100, (numel + offset,), generator=g).to(dtype)[offset:]
    new = base.clone()
    new[torch.randperm(numel, generator=g)[: numel // 7]] += 1
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[base.element_size()]
    expected = torch.ne(new.view(bits), base.view(bits)).nonzero().view(-1)
    assert torch.equal(deltas.changed(new, base), expected)


def test_a_bucket_whose_pairs_are_no_smaller_travels_whole():
    """bfloat16 pairs take 6 bytes per change against 2 per element: from a third of the bucket on, whole."""
    base = torch.zeros(90, dtype=torch.bfloat16)
    new = base.clone()
    new[:29] = 1
    assert deltas.encode(new, base)[0] == 29
    new[:30] = 1
    assert deltas.encode(new, base) == (DENSE, None)


def test_nothing_changed_is_an_empty_payload():
    base = torch.ones(10)
    count, payload = deltas.encode(base.clone(), base)
    assert count == 0 and payload.numel() == 0


def test_a_base_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="against a base"):
        deltas.encode(torch.zeros(10), torch.zeros(11))


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([1, 5, DENSE], "fits"),  # a count under a bucket's size, the other whole: read as is
        ([1, 5], "too few buckets"),
        ([1, 5, DENSE, 0], "too many buckets"),
        ([1, 11, 0], "more changes than the bucket has elements"),
        ([1, -2, 0], "a count below -1"),
        ([NO_BASE, 3, DENSE], "changes without a base"),
        ([-5, DENSE, DENSE], "a version below -1"),
    ],
)
def test_a_header_is_read_against_the_plans_buckets(values, why):
    numels = [10, 20]
    if why == "fits":
        assert deltas.read_header(torch.tensor(values), numels) == (1, [5, DENSE])
        return
    with pytest.raises(ValueError, match="does not fit the plan's 2 buckets"):
        deltas.read_header(torch.tensor(values), numels)


def test_an_index_past_the_bucket_is_refused():
    base, new = torch.zeros(8), torch.zeros(8)
    new[2] = 1
    count, payload = deltas.encode(new, base)
    deltas.split(payload, count, torch.float32)[0][0] = 8
    with pytest.raises(ValueError, match="past the bucket's 8 elements"):
        deltas.apply(payload, count, torch.zeros(8))
