"""DEAR (project's reading): decisions, anchor similarity, evidence and weights by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.distill.dear import anchor_similarity, dear_weights, decision_mask, evidence_mask

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# One row of 4 tokens; hidden states in 2-D.
H = t([[[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 0.0]]])
ONE = torch.ones(1, 4)


def test_decision_mask_top_entropy():
    # ceil(0.25 * 4) = 1 decision: the entropy 3.0 at position 2.
    got = decision_mask(t([[0.1, 0.5, 3.0, 1.0]]), ONE, 0.25)
    assert got.tolist() == [[False, False, True, False]]


def test_anchor_similarity_by_hand():
    # Anchor at position 2, h = (0, 1). cos with (1,0) = 0; with (1,1) = 1/sqrt 2;
    # with (-1, 0) = 0; the anchor itself has no other anchor: 0.
    dec = torch.tensor([[False, False, True, False]])
    e = anchor_similarity(H, dec, ONE)
    assert torch.allclose(e, t([[0.0, 1 / math.sqrt(2), 0.0, 0.0]]))
    # Two anchors 0 and 2: position 1 sees max(1/sqrt2, 1/sqrt2); position 3 sees
    # max(cos((-1,0),(1,0)) = -1, 0) -> clamped 0; anchor 0 sees anchor 2: 0; anchor 2 sees 0.
    dec2 = torch.tensor([[True, False, True, False]])
    assert torch.allclose(anchor_similarity(H, dec2, ONE), t([[0.0, 1 / math.sqrt(2), 0.0, 0.0]]))


def test_anchor_similarity_window_and_mask():
    dec = torch.tensor([[True, False, False, False]])
    # Window 1: only position 1 is within reach of anchor 0: cos((1,1),(1,0)) = 1/sqrt 2.
    # Position 2 (cos 0) and 3 (cos -1) are out of reach or clamped.
    assert torch.allclose(anchor_similarity(H, dec, ONE, window=1),
                          t([[0.0, 1 / math.sqrt(2), 0.0, 0.0]]))
    # Masking position 1 removes it; a masked anchor anchors nothing.
    m = torch.tensor([[1, 0, 1, 1]])
    assert torch.equal(anchor_similarity(H, dec, m)[0, 1], t(0.0))
    got = anchor_similarity(H, dec, torch.tensor([[0, 1, 1, 1]]))
    assert torch.equal(got, torch.zeros(1, 4, dtype=F64))


def test_evidence_mask_by_hand():
    # Decision at 0. e = [.., 0.5, 0.6, 0.2]; |A| = [.., 2, 0, 4] / max 4 = [.., 0.5, 0, 1].
    # v (boost 1) = [0.5 * 1.5, 0.6 * 1, 0.2 * 2] = [0.75, 0.6, 0.4]; r = 1/3 of 3 candidates
    # -> 1 evidence token: position 1. With boost 0: v = [0.5, 0.6, 0.2] -> position 2.
    e = t([[0.9, 0.5, 0.6, 0.2]])
    a = t([[10.0, -2.0, 0.0, 4.0]])
    dec = torch.tensor([[True, False, False, False]])
    assert evidence_mask(e, a, dec, ONE, 1 / 3, 1.0).tolist() == [[False, True, False, False]]
    assert evidence_mask(e, a, dec, ONE, 1 / 3, 0.0).tolist() == [[False, False, True, False]]


def test_dear_weights_by_hand():
    # Raw weights [2, 1, 0.5, 0(masked)] with w_other 0.5: mean over 3 masked = 3.5 / 3.
    dec = torch.tensor([[True, False, False, False]])
    ev = torch.tensor([[True, True, False, False]])
    m = torch.tensor([[1, 1, 1, 0]])
    raw = dear_weights(dec, ev, m, 2.0, 1.0, 0.5, unit_mean=False)
    assert torch.equal(raw, torch.tensor([[2.0, 1.0, 0.5, 0.0]]))
    w = dear_weights(dec, ev, m, 2.0, 1.0, 0.5)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.5, 0.0]]) * 3 / 3.5)
    assert w[m.bool()].mean().item() == pytest.approx(1.0)
    assert torch.equal(dear_weights(dec, ev, m, 0.0, 0.0, 0.0), torch.zeros(1, 4))


def test_bad_inputs():
    with pytest.raises(ValueError, match="hidden_B_T_H"):
        anchor_similarity(t([[1.0, 2.0]]), torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 2))
    with pytest.raises(ValueError, match="w_other"):
        dear_weights(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1), 1.0, 1.0, -1.0)
