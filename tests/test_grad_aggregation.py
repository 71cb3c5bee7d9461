"""Loss aggregation modes against hand values; micro-batching with global counts."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.maths.aggregation import aggregate, aggregation_names

F64 = torch.float64
MODES = ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean"]

# Row 0 keeps tokens 1, 2; row 1 keeps 4; row 2 keeps nothing and holds garbage (inf too:
# multiplying by the mask would turn it into NaN).
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1e30, -1e30, math.inf]], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def agg(mode, loss=LOSS, mask=MASK, **kw):
    kw.setdefault("global_tokens", 3.0)
    kw.setdefault("global_seqs", 2.0)
    kw.setdefault("constant", 6.0)
    return aggregate(loss, mask, mode, **kw)


def test_registry_holds_the_four_modes():
    assert aggregation_names() == MODES


def test_modes_by_hand():
    # Kept losses: row 0 has 1 and 2, row 1 has 4, row 2 nothing.
    # token-mean: (1 + 2 + 4) / 3 tokens = 7/3.
    # seq-mean-token-mean: ((1 + 2) / 2 + 4 / 1) / 2 seqs = (1.5 + 4) / 2 = 2.75.
    # seq-mean-token-sum: ((1 + 2) + 4) / 2 seqs = 3.5.
    # seq-mean-token-sum-norm with constant = T_max * seqs = 3 * 2 = 6: 7/6.
    expected = {"token-mean": 7 / 3, "seq-mean-token-mean": 2.75, "seq-mean-token-sum": 3.5,
                "seq-mean-token-sum-norm": 7 / 6}
    for mode, value in expected.items():
        out = agg(mode)
        assert out.dim() == 0 and out.dtype == F64
        assert torch.isclose(out, torch.tensor(value, dtype=F64), rtol=1e-15), mode


def test_masked_positions_and_empty_rows_give_no_value_and_no_gradient():
    for mode in MODES:
        loss = LOSS.clone().requires_grad_(True)
        out = agg(mode, loss)
        (grad,) = torch.autograd.grad(out, loss)
        assert torch.isfinite(out) and torch.isfinite(grad).all(), mode
        assert torch.all(grad[MASK == 0] == 0), mode
        # Same result with zeros instead of garbage at the masked positions.
        assert torch.equal(out.detach(), agg(mode, torch.where(MASK == 0, 0.0, LOSS))), mode
    # The per-token gradient of seq-mean-token-mean is 1 / (len_i * seqs): row 0 1/4, row 1 1/2.
    loss = LOSS.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(agg("seq-mean-token-mean", loss), loss)
    assert grad.tolist() == [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_micro_batches_with_global_counts_sum_to_the_full_batch():
    # The reason for global divisors: a micro-batch of rows 0-2 and one of rows 3-5, each
    # normalised by the counts of the whole step, add up to the full-batch loss and gradient.
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 7, generator=g, dtype=F64)
    lengths = torch.tensor([7, 1, 4, 0, 6, 3])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).to(F64)
    # The step's tokens and rows, as the trainer counts them (the empty row too).
    counts = dict(global_tokens=float(mask.sum()), global_seqs=6.0, constant=7.0 * 6)
    for mode in MODES:
        full_in = loss.clone().requires_grad_(True)
        full = aggregate(full_in, mask, mode, **counts)
        (g_full,) = torch.autograd.grad(full, full_in)
        parts_in = loss.clone().requires_grad_(True)
        parts = sum(aggregate(parts_in[rows], mask[rows], mode, **counts)
                    for rows in (slice(0, 3), slice(3, 6)))
        (g_parts,) = torch.autograd.grad(parts, parts_in)
        assert torch.allclose(parts, full, rtol=1e-13), mode
        assert torch.allclose(g_parts, g_full, rtol=1e-13), mode
    # With each micro-batch normalised by its own tokens (12 and 9), the sum is not the mean.
    local = sum(aggregate(loss[r], mask[r], "token-mean", global_seqs=3.0,
                          global_tokens=float(mask[r].sum()))
                for r in (slice(0, 3), slice(3, 6)))
    assert not torch.allclose(local, aggregate(loss, mask, "token-mean", **counts))


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck(mode):
    loss = torch.randn(3, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=F64)
    loss.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: aggregate(x, mask, mode, global_tokens=4.0, global_seqs=2.0, constant=8.0),
        (loss,))


def test_zero_dim_tensor_divisors_are_accepted():
    out = agg("token-mean", global_tokens=torch.tensor(3.0, dtype=F64))
    assert torch.isclose(out, torch.tensor(7 / 3, dtype=F64))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="seq-mean-token-mean, seq-mean-token-sum"):
        agg("mean")
    with pytest.raises(ValueError, match="needs constant"):
        agg("seq-mean-token-sum-norm", constant=None)
    with pytest.raises(ValueError, match="global_tokens"):
        agg("token-mean", global_tokens=0)
    with pytest.raises(ValueError, match="global_seqs"):
        agg("token-mean", global_seqs=float("inf"))
    with pytest.raises(ValueError, match="mask_B_T"):
        agg("token-mean", mask=MASK[:, :2])


def test_seq_mean_token_sum_norm_matches_verl_with_the_documented_constant():
    # verl 0.9.1, loss = mask = ones(2, 4), loss_scale_factor 4: each sequence's token sum
    # (4) over the factor is 1, averaged over the 2 sequences: 1.0. The docstring's recipe,
    # constant = loss_scale_factor * global_seqs = 8, gives the same; the factor alone (4)
    # would give 2.0, global_seqs times too large.
    ones = torch.ones(2, 4, dtype=F64)
    verl = aggregate(ones, ones, "seq-mean-token-sum-norm", global_tokens=8.0, global_seqs=2.0,
                     constant=4.0 * 2.0)
    assert verl.item() == 1.0
    assert aggregate(ones, ones, "seq-mean-token-sum-norm", global_tokens=8.0, global_seqs=2.0,
                     constant=4.0).item() == 2.0
