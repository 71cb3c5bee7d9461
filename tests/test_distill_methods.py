"""The distillation methods the trainer runs: hand-computed advantages and keep masks."""

from __future__ import annotations

import pytest
import torch

from gradient.distill.methods import DistillInput, distill_method_names, run_distill


def table(reward_B):
    # Two rollouts of two tokens (the second row's last token is padding).
    # student log-probs  [-1.0, -2.0], [-0.5, pad]
    # teacher log-probs  [-0.5, -1.0], [-1.5, pad]
    # reverse-KL advantage -(s - t): [0.5, 1.0], [-1.0, 0]; length-normalised return
    # G = [0.75, -1.0].
    return DistillInput(student_logp_B_T=torch.tensor([[-1.0, -2.0], [-0.5, 9.0]]),
                        teacher_logp_B_T=torch.tensor([[-0.5, -1.0], [-1.5, -9.0]]),
                        mask_B_T=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                        reward_adv_B=torch.tensor([0.5, -0.5]),
                        reward_B=torch.tensor(reward_B), kl_coef=2.0, reward_coef=1.0)


def test_opd_adds_the_reward_advantage_to_the_scaled_reverse_kl():
    out = run_distill("opd", table([1.0, 0.0]))
    # 0.5 + 2 * [0.5, 1.0] = [1.5, 2.5]; -0.5 + 2 * -1.0 = -2.5 and 0 on padding.
    torch.testing.assert_close(out.adv_B_T, torch.tensor([[1.5, 2.5], [-2.5, 0.0]]))
    assert out.keep_B.tolist() == [True, True]


@pytest.mark.parametrize("rewards, kept", [
    ([1.0, 0.0], [True, True]),    # solved & teacher liked it (G > 0); failed & G < 0
    ([0.0, 1.0], [False, False]),  # failed though the teacher liked it; solved though not
    ([1.0, 1.0], [True, False]),
    ([0.0, 0.0], [False, True]),
])
def test_ra_opd_keeps_rollouts_whose_return_agrees_with_the_outcome(rewards, kept):
    out = run_distill("ra_opd", table(rewards))
    assert out.keep_B.tolist() == kept
    assert out.metrics["kept_frac"] == pytest.approx(sum(kept) / 2)


def test_unknown_method_names_the_valid_ones():
    assert distill_method_names() == ["opd", "ra_opd"]
    with pytest.raises(ValueError, match="choose one of opd, ra_opd"):
        run_distill("gkd", table([1.0, 0.0]))
