"""RA-OPD keep mask: the four sign cases, the zero cases, the normaliser and the metrics."""

from __future__ import annotations

import pytest
import torch

from gradient.distill.ra_opd import distillation_return, kept_token_mask, ra_keep, ra_metrics

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# Rows: G = mean of masked a_t.
# row 0: (1 + 3) / 2 = 2      row 1: (-1 - 3) / 2 = -2
# row 2: 2 (as row 0)         row 3: -2 (as row 1)
# row 4: (1 - 1) / 2 = 0      row 5: 0.5 (one token; 100 is masked)
ADV = t([[1.0, 3.0], [-1.0, -3.0], [1.0, 3.0], [-1.0, -3.0], [1.0, -1.0], [0.5, 100.0]])
MASK = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [1, 1], [1, 0]])


def test_distillation_return_by_hand():
    assert torch.equal(distillation_return(ADV, MASK), t([2.0, -2.0, 2.0, -2.0, 0.0, 0.5]))


def test_four_sign_cases_and_zero_cases():
    # (R+, G+) keep, (R+, G-) drop, (R-, G+) drop, (R-, G-) keep, G = 0 keep, outcome 0 keep.
    reward = t([1.0, 1.0, -1.0, -1.0, -1.0, 0.0])
    assert ra_keep(ADV, MASK, reward).tolist() == [True, False, False, True, True, True]


def test_binary_reward_as_2r_minus_1_and_centred_advantage_agree_in_mixed_groups():
    r = t([1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    centred = r - r.mean()  # [0.5, 0.5, -0.5, -0.5, -0.5, 0.5]
    assert torch.equal(ra_keep(ADV, MASK, 2 * r - 1), ra_keep(ADV, MASK, centred))
    # row 5 now has outcome +1 and G = 0.5: kept.
    assert ra_keep(ADV, MASK, 2 * r - 1).tolist() == [True, False, False, True, True, True]


def test_empty_row_is_never_kept():
    keep = ra_keep(t([[1.0, 1.0]]), torch.tensor([[0, 0]]), t([1.0]))
    assert keep.tolist() == [False]


def test_kept_mask_and_metrics():
    keep = torch.tensor([True, False, False, True, True, True])
    # Kept tokens: 2 + 2 + 2 + 1 = 7 of 11.
    km = kept_token_mask(keep, MASK)
    assert km[1].tolist() == [False, False] and km[5].tolist() == [True, False]
    m = ra_metrics(keep, MASK)
    assert m["kept_frac"].item() == pytest.approx(4 / 6)
    assert m["kept_token_frac"].item() == pytest.approx(7 / 11)


def test_nothing_kept_gives_zero_metrics():
    keep = torch.zeros(6, dtype=torch.bool)
    assert ra_metrics(keep, MASK)["kept_frac"].item() == 0.0


def test_bad_shapes():
    with pytest.raises(ValueError, match="reward_adv_B"):
        ra_keep(ADV, MASK, t([1.0]))
    with pytest.raises(ValueError, match="keep_B"):
        kept_token_mask(torch.ones(2, dtype=torch.bool), MASK)
