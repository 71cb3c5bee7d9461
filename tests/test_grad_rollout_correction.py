"""Trainer/engine importance weights, checked against hand-computed tables."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.maths.rollout_correction import IS_MODES, is_weights

# Two sequences, three token slots; the second has two real tokens and one pad.
#   delta row 0 = ln 2, ln 2, -ln 4      -> token rho 2, 2, 0.25;  sum 0      -> seq rho 1
#   delta row 1 = ln 4, ln 0.8, (pad)    -> token rho 4, 0.8;      sum ln 3.2 -> seq rho 3.2
# Bounds [0.5, 3]:
#   token_truncate   : 2, 2, 0.5 | 3, 0.8      (tokens hit: 0.25 and 4 -> 2 of 5)
#   token_mask       : 2, 2, 0   | 0, 0.8      (same 2 of 5 hit)
#   sequence_truncate: 1, 1, 1   | 3, 3        (row 1 hit: 2 of 5 tokens, 1 of 2 rows)
#   sequence_mask    : 1, 1, 1   | 0, 0        (same)
# |delta| over real tokens: ln 2, ln 2, ln 4, ln 4, ln 1.25 -> max ln 4, mean their sum / 5.
L2, L4 = math.log(2), math.log(4)
DELTA = [[L2, L2, -L4], [L4, math.log(0.8), 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
EXPECTED = {
    "none": ([[1, 1, 1], [1, 1, 0]], 0 / 5, 0 / 2),
    "token_truncate": ([[2, 2, 0.5], [3, 0.8, 0]], 2 / 5, 2 / 2),
    "token_mask": ([[2, 2, 0], [0, 0.8, 0]], 2 / 5, 2 / 2),
    "sequence_truncate": ([[1, 1, 1], [3, 3, 0]], 2 / 5, 1 / 2),
    "sequence_mask": ([[1, 1, 1], [0, 0, 0]], 2 / 5, 1 / 2),
}


def table(pad_value: float = 0.0):
    """(trainer, engine, mask): engine log-probs are arbitrary, trainer = engine + delta;
    both hold ``pad_value`` at the pad."""
    engine = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, pad_value]])
    trainer = engine + torch.tensor(DELTA)
    trainer[1, 2] = pad_value
    return trainer, engine, torch.tensor(MASK, dtype=torch.float32)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_weights_and_metrics_match_the_hand_computed_table(mode):
    weight, token_frac, seq_frac = EXPECTED[mode]
    w, m = is_weights(*table(), mode=mode, c_min=0.5, c_max=3.0)
    torch.testing.assert_close(w, torch.tensor(weight, dtype=torch.float32))
    torch.testing.assert_close(m["token_fraction_corrected"], torch.tensor(token_frac))
    torch.testing.assert_close(m["sequence_fraction_corrected"], torch.tensor(seq_frac))
    torch.testing.assert_close(m["logp_abs_diff_max"], torch.tensor(L4))
    mean = (2 * L2 + 2 * L4 + math.log(1.25)) / 5
    torch.testing.assert_close(m["logp_abs_diff_mean"], torch.tensor(mean))
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in m.values())


@pytest.mark.parametrize("mode", sorted(IS_MODES))
@pytest.mark.parametrize("pad_value", [-7.0, float("-inf"), float("nan")])
def test_padding_never_matters(mode, pad_value):
    w0, m0 = is_weights(*table(0.0), mode=mode, c_min=0.5, c_max=3.0)
    w, m = is_weights(*table(pad_value), mode=mode, c_min=0.5, c_max=3.0)
    torch.testing.assert_close(w, w0)
    for k in m0:
        torch.testing.assert_close(m[k], m0[k])


def test_sequence_level_sums_rather_than_averages():
    # Ten tokens of delta 0.2: a mean would give exp(0.2) = 1.22 (inside [0.5, 3]); the sum
    # gives exp(2) = 7.39, which sequence_mask drops and sequence_truncate caps at 3.
    trainer = torch.full((1, 10), -1.0)
    engine, mask = trainer - 0.2, torch.ones(1, 10)
    w, _ = is_weights(trainer, engine, mask, mode="sequence_mask", c_min=0.5, c_max=3.0)
    assert not w.any()
    w, _ = is_weights(trainer, engine, mask, mode="sequence_truncate", c_min=0.5, c_max=3.0)
    torch.testing.assert_close(w, torch.full((1, 10), 3.0))
    # A hugely mismatched sequence overflows exp without producing NaN.
    w, _ = is_weights(trainer, trainer - 100.0, mask, mode="sequence_truncate",
                      c_min=0.5, c_max=3.0)
    torch.testing.assert_close(w, torch.full((1, 10), 3.0))


def test_weights_are_detached_and_inputs_validated():
    trainer, engine, mask = table()
    trainer.requires_grad_(True)
    w, m = is_weights(trainer, engine, mask, mode="token_truncate", c_min=0.5, c_max=3.0)
    assert not w.requires_grad and not any(v.requires_grad for v in m.values())
    with pytest.raises(ValueError, match="token_truncate"):  # the message lists valid modes
        is_weights(trainer, engine, mask, mode="tis", c_min=0.5, c_max=3.0)
    with pytest.raises(ValueError, match="c_min"):
        is_weights(trainer, engine, mask, mode="token_mask", c_min=3.0, c_max=0.5)
