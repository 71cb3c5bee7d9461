"""Diffusion-LM log-prob masks: quadrature, SLIM-RL's schedule, d1's masks and TraceRL's rows
against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradient.dllm.masks import (
    block_mask_schedule,
    collapse_steps,
    gauss_legendre,
    mean_field_masks,
    sample_block_masks,
    trace_rows,
)


def test_gauss_legendre_on_the_unit_interval():
    t, w = gauss_legendre(3)
    # Nodes 1/2 -+ sqrt(15)/10 and 1/2, weights 5/18, 8/18, 5/18.
    assert t == pytest.approx([0.5 - math.sqrt(15) / 10, 0.5, 0.5 + math.sqrt(15) / 10])
    assert w == pytest.approx([5 / 18, 8 / 18, 5 / 18])
    assert (w * t**5).sum() == pytest.approx(1 / 6)  # exact up to degree 2n - 1 = 5
    assert gauss_legendre(1)[0] == pytest.approx([0.5]) and gauss_legendre(1)[1] == pytest.approx([1.0])


def test_block_schedule_preserves_the_mean_and_decreases_across_blocks():
    p = block_mask_schedule(0.5, 3)
    # spread 0.2: 0.6, 0.5, 0.4.
    assert p == pytest.approx([0.6, 0.5, 0.4])
    for t in (0.05, 0.3, 0.5, 0.88):
        for K in (2, 4, 7):
            p = block_mask_schedule(t, K)
            assert p.mean() == pytest.approx(t)
            assert np.all(np.diff(p) < 0) and np.all((p > 0) & (p < 1))
    # Near the edges the spread shrinks to 2 min(t, 1 - t): t = 0.05 spans 0.0999.
    p = block_mask_schedule(0.05, 2)
    assert p[0] - p[1] == pytest.approx(0.1 - 1e-6)
    assert block_mask_schedule(0.3, 1) == pytest.approx([0.3])


def test_block_masks_follow_the_schedule_and_never_come_out_empty():
    valid = torch.ones(4000, 8, dtype=torch.bool)
    valid[:, 6:] = False
    masks = sample_block_masks(valid, 4, [0.8, 0.2], torch.Generator().manual_seed(0))
    assert not masks[:, 6:].any()
    assert masks[:, :4].float().mean().item() == pytest.approx(0.8, abs=0.02)
    assert masks[:, 4:6].float().mean().item() == pytest.approx(0.2, abs=0.03)
    rare = sample_block_masks(valid[:50], 4, [1e-6, 1e-6], torch.Generator().manual_seed(1))
    assert rare.sum(-1).tolist() == [1] * 50 and rare[:, 0].all()


def test_mean_field_masks_the_canvas_and_a_seeded_share_of_the_prompt():
    prompt = torch.zeros(2000, 10, dtype=torch.bool)
    prompt[:, :6] = True
    canvas = ~prompt
    a = mean_field_masks(prompt, canvas, 0.15, seed=7)
    assert a[:, 6:].all()
    assert a[:, :6].float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert torch.equal(a, mean_field_masks(prompt, canvas, 0.15, seed=7))
    assert not torch.equal(a, mean_field_masks(prompt, canvas, 0.15, seed=8))


def test_trace_rows_replay_the_sampler_block_by_block():
    # Two blocks of 3: block 1 committed at steps 1, 0, 0; block 2 at 3, 2, 2.
    rows = trace_rows([1, 0, 0, 3, 2, 2], block_length=3)
    as_lists = [(t.int().tolist(), m.int().tolist()) for t, m in rows]
    assert as_lists == [
        ([0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]),  # before step 0: everything masked
        ([1, 0, 0, 0, 0, 0], [1, 0, 0, 1, 1, 1]),  # before step 1: block 2 still masked
        ([0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]),  # before step 2: block 1 clean
        ([0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]),
    ]
    # Every canvas position is a target exactly once.
    assert torch.stack([t for t, _ in rows]).sum(0).tolist() == [1] * 6


def test_shrinkage_merges_consecutive_steps():
    assert collapse_steps([1, 0, 0, 3, 2, 2, -1], 2) == [0, 0, 0, 2, 2, 2, -1]
    rows = trace_rows([1, 0, 0, 3, 2, 2], block_length=3, shrink=2)
    assert [t.int().tolist() for t, _ in rows] == [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]
    # Positions outside the canvas (step -1) are never masked or targeted.
    rows = trace_rows([0, 1, -1, -1], block_length=2)
    assert all(not m[2:].any() and not t[2:].any() for t, m in rows)
