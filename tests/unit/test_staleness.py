"""The staleness rule floor((N_r - 1) / B) <= i + η, checked against hand-computed values."""

import pytest

from asyncrl.controller.staleness import admissible, max_admissible


@pytest.mark.parametrize(
    "admitted, n_new, version, expected",
    [
        (0, 4, 0, True),  # N_r = 4: floor(3/4) = 0 <= 0
        (3, 1, 0, True),  # N_r = 4, the last slot of version 0
        (4, 1, 0, False),  # N_r = 5: floor(4/4) = 1 > 0
        (3, 2, 0, False),  # the group's last trajectory (N_r = 5) decides, not its first (N_r = 4)
        (4, 4, 1, True),  # version 1 admits N_r up to 8
        (8, 1, 1, False),  # N_r = 9: floor(8/4) = 2 > 1
    ],
)
def test_synchronous_eta0_batch4(admitted, n_new, version, expected):
    assert admissible(admitted, n_new, batch_size=4, version=version, eta=0) is expected


def test_eta0_admits_exactly_one_batch_per_version():
    batch = 8
    admitted = 0
    for version in range(5):
        granted = 0
        while admissible(admitted, 1, batch, version, eta=0):
            admitted += 1
            granted += 1
        assert granted == batch, version
        assert admitted == (version + 1) * batch


@pytest.mark.parametrize(
    "admitted, n_new, version, expected",
    [
        (184, 8, 0, True),  # N_r = 192: floor(191/64) = 2 <= 0 + 2
        (185, 8, 0, False),  # N_r = 193: floor(192/64) = 3 > 2
        (191, 1, 0, True),
        (192, 1, 0, False),
        (504, 8, 5, True),  # N_r = 512: floor(511/64) = 7 <= 5 + 2
        (512, 1, 5, False),  # N_r = 513: floor(512/64) = 8 > 7
    ],
)
def test_eta2_batch64(admitted, n_new, version, expected):
    assert admissible(admitted, n_new, batch_size=64, version=version, eta=2) is expected


def test_unbounded_eta_admits_everything():
    assert admissible(10**9, 64, batch_size=64, version=0, eta=None)
    assert max_admissible(0, 64, None) is None


def test_max_admissible_closed_form():
    assert max_admissible(0, 4, 0) == 4
    assert max_admissible(0, 64, 2) == 192
    assert max_admissible(5, 64, 2) == 512
    assert max_admissible(3, 1, 0) == 4  # B = 1, η = 0: one trajectory per version


@pytest.mark.parametrize("batch, eta", [(1, 0), (4, 0), (4, 1), (6, 3), (64, 2)])
def test_max_admissible_is_the_rule_boundary(batch, eta):
    for version in range(4):
        limit = max_admissible(version, batch, eta)
        for total in range(1, limit + 3 * batch):
            assert admissible(total - 1, 1, batch, version, eta) is (total <= limit), (version, total)


@pytest.mark.parametrize(
    "admitted, n_new, batch",
    [(0, 0, 4), (0, -1, 4), (-1, 1, 4), (0, 1, 0)],
)
def test_out_of_range_arguments_raise(admitted, n_new, batch):
    with pytest.raises(ValueError):
        admissible(admitted, n_new, batch, 0, 0)
