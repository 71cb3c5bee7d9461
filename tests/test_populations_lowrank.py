"""Low-rank keyed noise and its estimate, by hand on tiny matrices; the perturbation kinds;
the shapings for members scored on their own prompts."""

from __future__ import annotations

import math

import pytest
import torch

from populations import es as pes
from populations import lowrank
from populations.noise import gaussian, keyed_noise, noise_key
from populations.perturbations import KindInput, perturbation
from populations.shaping import shape_fitness


def test_factors_are_the_keyed_draw_split_into_A_and_B():
    A, B = lowrank.factors(7, 2, 5, "w", (3, 4), 2)
    draw = gaussian(noise_key(7, 2, 5, "w"), (7, 2))
    assert torch.equal(A, draw[:3]) and torch.equal(B, draw[3:])
    assert A.shape == (3, 2) and B.shape == (4, 2)
    # Another direction or name is another stream.
    assert not torch.equal(lowrank.factors(7, 2, 6, "w", (3, 4), 2)[0], A)
    assert not torch.equal(lowrank.factors(7, 2, 5, "v", (3, 4), 2)[0], A)


def test_dense_noise_by_hand():
    A = torch.tensor([[1.0], [2.0]])
    B = torch.tensor([[3.0], [-1.0], [0.5]])
    assert torch.equal(lowrank.dense(A, B), torch.tensor([[3.0, -1.0, 0.5], [6.0, -2.0, 1.0]]))
    A2 = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    B2 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # A B^T / sqrt(2) = [[1, 1], [0, 2]] / sqrt(2)
    assert torch.allclose(lowrank.dense(A2, B2), torch.tensor([[1.0, 1.0], [0.0, 2.0]]) / math.sqrt(2))


def test_dense_entries_have_unit_variance_for_every_rank():
    for r in (1, 4, 16):
        E = torch.stack([lowrank.dense(*lowrank.factors(0, 0, d, "w", (64, 64), r))
                         for d in range(40)])
        # 163,840 entries: the sample variance is within a few percent of 1.
        assert abs(float(E.var()) - 1.0) < 0.05, r
        assert abs(float(E.mean())) < 0.02


def test_estimate_equals_the_explicit_sum_and_ignores_chunking():
    coefs = ((0, 0.5), (3, -1.25), (4, 2.0))
    f = lowrank.keyed_factors(1, 9, 2)
    explicit = sum(c * lowrank.dense(*f(d, "w", (5, 3))) for d, c in coefs)
    for chunk in (1, 2, 256):
        got = lowrank.accumulate(coefs, "w", torch.Size((5, 3)), f, chunk=chunk)
        assert got.dtype == torch.float32
        assert torch.allclose(got, explicit, atol=1e-6), chunk
    assert torch.equal(lowrank.accumulate((), "w", torch.Size((5, 3)), f),
                       torch.zeros(5, 3))


def test_estimate_bits_do_not_depend_on_the_thread_count():
    """mpirun gives each rank a share of the cores: the update must be the serial one. On an
    Intel Xeon this accumulation differed in its last bits between 1 and 2 threads when the
    products were MKL's addmm with a scale."""
    coefs = [(d, 0.01 * (d - 16)) for d in range(32)]
    before = torch.get_num_threads()
    sums = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            sums.append(lowrank.accumulate(coefs, "w", torch.Size((256, 64)),
                                           lowrank.keyed_factors(0, 0, 2)))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(sums[0], sums[1]) and torch.equal(sums[0], sums[2])


def test_rank_must_fit_the_matrix():
    with pytest.raises(ValueError, match=r"rank must be an int in \[1, 3\]"):
        lowrank.factors(0, 0, 0, "w", (3, 8), 4)
    with pytest.raises(ValueError, match="rank must be an int"):
        lowrank.factors(0, 0, 0, "w", (3, 8), 0)
    with pytest.raises(ValueError, match="needs a matrix"):
        lowrank.factors(0, 0, 0, "b", (8,), 1)


def test_vectors_are_frozen_or_get_full_noise():
    frozen = perturbation("lowrank", KindInput(0, 1, rank=1, vectors="frozen"))
    full = perturbation("lowrank", KindInput(0, 1, rank=1, vectors="full"))
    shape = torch.Size((6,))
    assert torch.equal(frozen.dense(2, "norm", shape), torch.zeros(6))
    assert torch.equal(frozen.estimate(((2, 1.0),), "norm", shape), torch.zeros(6))
    assert torch.equal(full.dense(2, "norm", shape), keyed_noise(0, 1)(2, "norm", shape))
    with pytest.raises(ValueError, match="unknown perturbation kind"):
        perturbation("sparse", KindInput(0, 1))


def test_lowrank_tell_is_lr_times_the_paired_low_rank_estimate():
    cfg = pes.ESConfig(population=4, sigma=0.1, antithetic=True, shaping="raw", kind="lowrank",
                       rank=1, vectors="frozen", optimizer="sgd", lr=0.5)
    params = {"w": torch.zeros(2, 3), "norm": torch.ones(3)}
    state = pes.init(cfg, params, 0)
    # Fitness 1, 0 on pair 0 and 0, 0 on pair 1: raw weights 0.75, -0.25, -0.25, -0.25.
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    new, metrics = pes.tell(cfg, state, rewards)
    E0 = lowrank.dense(*lowrank.factors(0, 0, 0, "w", (2, 3), 1))
    # c_0 = (0.75 - (-0.25)) / 4 = 0.25; pair 1 cancels exactly.
    assert torch.allclose(new.params["w"], 0.5 * 0.25 * E0, atol=1e-7)
    assert torch.equal(new.params["norm"], torch.ones(3))
    assert metrics["directions"] == 1.0
    # Members are evaluated at theta + s * sigma * E_d.
    member = pes.ask(cfg, state)[1]
    assert torch.allclose(pes.perturbed_params(cfg, state, member)["w"], -0.1 * E0)


def test_group_zscore_with_groups_pools_a_prompt_across_members():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    by_column = torch.tensor([[0, 1]] * 4)
    # Groups equal to the columns are the plain per-column z-scores.
    assert torch.allclose(shape_fitness("group_zscore", rewards, groups_N_P=by_column),
                          shape_fitness("group_zscore", rewards))
    # Members 0, 1 saw prompts 5 and 6; members 2, 3 saw 6 and 7.
    groups = torch.tensor([[5, 6], [5, 6], [6, 7], [6, 7]])
    w = shape_fitness("group_zscore", rewards, groups_N_P=groups)
    # Prompt 5: rewards 1, 0 -> z = +1, -1. Prompt 6: 0, 0, 1, 1 -> -1, -1, +1, +1.
    # Prompt 7: 1, 1 -> constant -> 0. Member 0: (+1 - 1) / 2 = 0; member 1: (-1 - 1) / 2;
    # members 2 and 3: (+1 + 0) / 2.
    assert torch.allclose(w, torch.tensor([0.0, -1.0, 0.5, 0.5], dtype=torch.float64), atol=1e-6)
    with pytest.raises(ValueError, match="groups_N_P must be an integer tensor"):
        shape_fitness("group_zscore", rewards, groups_N_P=by_column.float())


def test_pair_diff_by_hand():
    # Fitness 3, 1 | 2, 2 | 0, 2: d = 2, 0, -2, rms = sqrt(8 / 3).
    rewards = torch.tensor([[3.0], [1.0], [2.0], [2.0], [0.0], [2.0]])
    rms = math.sqrt(8 / 3)
    w = shape_fitness("pair_diff", rewards, eps=0.0)
    expected = torch.tensor([1 / rms, -1 / rms, 0, 0, -1 / rms, 1 / rms], dtype=torch.float64)
    assert torch.allclose(w, expected)
    # A constant offset per pair (how hard its prompts were) changes nothing.
    shifted = rewards + torch.tensor([[5.0], [5.0], [-1.0], [-1.0], [0.0], [0.0]])
    assert torch.allclose(shape_fitness("pair_diff", shifted, eps=0.0), expected)
    assert torch.equal(shape_fitness("pair_diff", torch.ones(4, 2)), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs antithetic"):
        pes.ESConfig(population=4, antithetic=False, shaping="pair_diff")


def test_realised_cosine_of_an_update_served_in_bf16():
    old = {"w": torch.ones(4)}
    # bf16 spacing at 1.0 is 2**-7: an update of 2**-6 survives exactly, 1e-5 rounds away.
    exact = {"w": old["w"] + torch.tensor([2.0 ** -6, 0.0, -(2.0 ** -6), 0.0])}
    assert pes.realised_cosine(old, exact, torch.bfloat16) == pytest.approx(1.0)
    lost = {"w": old["w"] + 1e-5}
    assert pes.realised_cosine(old, lost, torch.bfloat16) == 0.0
    # Half survives (2**-6 on entry 0), half is lost (1e-5 on entry 1): cos = 2**-6 / |i|.
    mixed = {"w": old["w"] + torch.tensor([2.0 ** -6, 1e-5, 0.0, 0.0])}
    i = torch.tensor([2.0 ** -6, 1e-5], dtype=torch.float64)
    assert pes.realised_cosine(old, mixed, torch.bfloat16) == pytest.approx(
        float(2.0 ** -6 / i.norm()), rel=1e-4)
    assert pes.realised_cosine(old, old, torch.bfloat16) == 1.0
