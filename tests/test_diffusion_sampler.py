"""Diffusion samplers: hand-computed commit rules, and full decodes with a scripted denoiser
whose confidences fix the commit order."""

from __future__ import annotations

import pytest
import torch

from es_llm.diffusion.sampler import (
    CommitInput,
    DiffusionSampling,
    commit,
    low_confidence_count,
    predict,
    sample,
    tau_budget_count,
    transfer_schedule,
)
from es_llm.errors import BadInput

MASK, PAD, V = 4, 0, 12


def test_transfer_schedule_spreads_the_remainder_over_the_first_steps():
    assert transfer_schedule(10, 4) == [3, 3, 2, 2]
    assert transfer_schedule(16, 8) == [2] * 8
    assert transfer_schedule(5, 5) == [1] * 5


def test_tau_budget_takes_the_longest_prefix_that_fits_the_budget():
    cfg = DiffusionSampling(kind="tau_budget", gen_length=8, block_length=8, steps=8, tau=0.9)
    inf = float("-inf")
    # Above tau: 0.99, 0.97, 0.95 -> uncertainties 0.01, 0.03, 0.05, cumsum 0.09 <= 0.1.
    conf = torch.tensor([[0.95, 0.5, 0.99, 0.97, inf, inf, inf, inf],
                         # 0.96, 0.93 -> 0.04 + 0.07 = 0.11 > 0.1: only the first fits.
                         [0.93, 0.96, 0.2, 0.1, inf, inf, inf, inf],
                         # Nothing above tau: the static count (8 / 8 = 1).
                         [0.5, 0.4, inf, inf, inf, inf, inf, inf]])
    masked = torch.tensor([4, 4, 2])
    assert tau_budget_count(CommitInput(conf, masked, 0, cfg)).tolist() == [3, 1, 1]
    # m = 0 means m = the static count: with 4 steps over 8 tokens it is 2, budget 0.2.
    cfg2 = DiffusionSampling(kind="tau_budget", gen_length=8, block_length=8, steps=4,
                             tau=0.9, budget_m=0)
    assert tau_budget_count(CommitInput(conf, masked, 0, cfg2)).tolist() == [3, 2, 2]


def test_low_confidence_count_follows_the_schedule_and_finishes_the_block():
    cfg = DiffusionSampling(gen_length=10, block_length=10, steps=4)
    conf = torch.zeros(2, 10)
    masked = torch.tensor([10, 2])
    assert low_confidence_count(CommitInput(conf, masked, 0, cfg)).tolist() == [3, 2]
    assert low_confidence_count(CommitInput(conf, torch.tensor([5, 2]), 3, cfg)).tolist() == [5, 2]


def test_commit_picks_the_top_k_and_breaks_ties_by_position():
    conf = torch.tensor([[0.1, 0.9, 0.9, float("-inf")], [0.3, 0.2, 0.1, 0.0]])
    assert commit(conf, torch.tensor([2, 1])).tolist() == [[False, True, True, False],
                                                           [True, False, False, False]]
    assert commit(conf, torch.tensor([4, 0]))[0].tolist() == [True, True, True, False]


def scripted_denoiser(target: list[int], confidence: list[float]):
    """Predicts ``target`` at canvas position i with probability ``confidence[i]``, wherever
    the canvas starts; the rest of the mass is spread over the other tokens."""
    def denoise(ids_B_T, attention_B_T):
        B, T = ids_B_T.shape
        logits = torch.zeros(B, T, V)
        for b in range(B):
            start = denoise.starts[b]  # the canvas offset (prompt length) of row b
            for i, (tok, c) in enumerate(zip(target, confidence)):
                rest = (1 - c) / (V - 1)
                logits[b, start + i] = torch.log(torch.full((V,), rest))
                logits[b, start + i, tok] = torch.log(torch.tensor(c))
        return logits
    return denoise


def test_low_confidence_decode_commits_most_confident_first_block_by_block():
    target = [5, 6, 7, 8, 9, 10]
    confidence = [0.5, 0.9, 0.8, 0.6, 0.95, 0.7]
    denoise = scripted_denoiser(target, confidence)
    denoise.starts = [2, 3]
    cfg = DiffusionSampling(gen_length=6, block_length=3, steps=4)
    gen = torch.Generator().manual_seed(0)
    canvas = sample(denoise, [[1, 11], [1, 11, 11]], cfg, 0.0, gen, MASK, PAD, record_states=True)
    # Block 1 (positions 0-2): 2 steps of [2, 1] tokens: 0.9, 0.8 first, then 0.5.
    # Block 2 (positions 3-5): 0.95, 0.7 at step 2, then 0.6 at step 3.
    assert canvas.step_map_B_L.tolist() == [[1, 0, 0, 3, 2, 2]] * 2
    assert canvas.ids_B_T[0, 2:8].tolist() == target and canvas.ids_B_T[1, 3:9].tolist() == target
    assert len(canvas.states) == 4
    assert canvas.states[0][0].tolist() == [MASK, 6, 7, MASK, MASK, MASK]


def test_tau_budget_decode_commits_confident_runs_in_one_step():
    target = [5, 6, 7, 8]
    confidence = [0.99, 0.97, 0.5, 0.95]
    denoise = scripted_denoiser(target, confidence)
    denoise.starts = [1]
    cfg = DiffusionSampling(kind="tau_budget", gen_length=4, block_length=4, steps=4, tau=0.9)
    canvas = sample(denoise, [[1]], cfg, 0.0, torch.Generator(), MASK, PAD)
    # Step 0: 0.99, 0.97, 0.95 fit the budget (0.09 <= 0.1); step 1: the rest.
    assert canvas.step_map_B_L.tolist() == [[0, 0, 1, 0]]
    assert canvas.ids_B_T[0, 1:].tolist() == target


def test_sampling_at_temperature_is_seeded():
    torch.manual_seed(0)
    table = torch.randn(V)

    def denoise(ids_B_T, attention_B_T):
        return table.expand(*ids_B_T.shape, V) + 0.1 * ids_B_T[..., None].float()

    cfg = DiffusionSampling(gen_length=8, block_length=4, steps=4)
    run = lambda seed: sample(denoise, [[1, 2]] * 3, cfg, 1.0,  # noqa: E731
                              torch.Generator().manual_seed(seed), MASK, PAD).ids_B_T
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_predict_draws_tokens_with_the_softmax_probabilities():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).log_softmax(-1)
    x0, conf = predict(logits.expand(1, 40000, 4), 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(x0[0], minlength=4).float() / 40000
    assert torch.allclose(freq, logits.exp(), atol=0.01)
    assert torch.allclose(conf[0], logits.exp()[x0[0]])
    greedy, _ = predict(logits.expand(1, 3, 4), 0.0, torch.Generator())
    assert greedy.tolist() == [[0, 0, 0]]


def test_bad_sampler_settings_are_refused():
    with pytest.raises(BadInput, match="multiple of block_length"):
        DiffusionSampling(gen_length=10, block_length=4)
    with pytest.raises(BadInput, match="unknown diffusion sampler"):
        DiffusionSampling(kind="random")
    with pytest.raises(BadInput, match="multiple of the number of blocks"):
        DiffusionSampling(gen_length=16, block_length=4, steps=6)
