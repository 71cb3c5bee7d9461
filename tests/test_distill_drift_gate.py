"""BPDG drift gates: hand values, unit mean, detachment, identity when nothing drifted."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.distill.drift_gate import drift_gates

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# One row, T = 5, block size 2: blocks {0,1}, {2,3}, {4}; position 3 is padding.
# delta = behaviour - current = [0.5, -0.1, 1.0, (masked), -2.0]
# block means: 0.2, 1.0, -2.0; tau = 1: g = [e^-0.2, e^-1, e^-2].
CUR = t([[-1.0, -1.0, -2.0, 9.0, -1.0]])
BEH = t([[-0.5, -1.1, -1.0, float("nan"), -3.0]])
MASK = torch.tensor([[1, 1, 1, 0, 1]])
G = [math.exp(-0.2), math.exp(-1.0), math.exp(-2.0)]


def test_token_unit_mean_by_hand():
    # Token counts per block 2, 1, 1: mean over tokens = (2 g0 + g1 + g2) / 4.
    d = (2 * G[0] + G[1] + G[2]) / 4
    got = drift_gates(CUR, BEH, MASK, 2, 1.0)
    want = t([[G[0] / d, G[0] / d, G[1] / d, 0.0, G[2] / d]])
    assert torch.allclose(got, want, atol=1e-12)
    assert got[MASK.bool()].mean().item() == pytest.approx(1.0)


def test_block_unit_mean_by_hand():
    d = sum(G) / 3
    got = drift_gates(CUR, BEH, MASK, 2, 1.0, unit_mean_over="blocks")
    want = t([[G[0] / d, G[0] / d, G[1] / d, 0.0, G[2] / d]])
    assert torch.allclose(got, want, atol=1e-12)


def test_unit_mean_on_random_batch_and_empty_blocks():
    g = torch.Generator().manual_seed(0)
    cur = torch.randn(3, 11, generator=g, dtype=F64)
    beh = cur + 0.3 * torch.randn(3, 11, generator=g, dtype=F64)
    mask = (torch.rand(3, 11, generator=g) > 0.3).int()
    mask[1] = 0  # a row without tokens
    mask[0, :4] = 0  # an empty block
    gate = drift_gates(cur, beh, mask, 4, 2.0)
    assert gate[mask.bool()].mean().item() == pytest.approx(1.0)
    assert torch.all(gate[~mask.bool()] == 0)


def test_no_drift_gives_ones():
    cur = t([[-1.0, -2.0, -3.0]])
    assert torch.equal(drift_gates(cur, cur.clone(), torch.ones(1, 3), 2, 5.0),
                       torch.ones(1, 3, dtype=F64))


def test_detached():
    cur = CUR.clone().requires_grad_()
    assert not drift_gates(cur, BEH, MASK, 2, 1.0).requires_grad


def test_no_tokens_gives_zeros():
    got = drift_gates(CUR, BEH, torch.zeros(1, 5), 2, 1.0)
    assert torch.equal(got, torch.zeros(1, 5, dtype=F64))


def test_bad_settings():
    with pytest.raises(ValueError, match="block_size"):
        drift_gates(CUR, BEH, MASK, 0, 1.0)
    with pytest.raises(ValueError, match="tau"):
        drift_gates(CUR, BEH, MASK, 2, -1.0)
    with pytest.raises(ValueError, match="tokens, blocks"):
        drift_gates(CUR, BEH, MASK, 2, 1.0, unit_mean_over="rows")
