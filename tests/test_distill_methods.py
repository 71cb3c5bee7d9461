"""The distillation methods the trainer runs: hand-computed advantages and keep masks."""

from __future__ import annotations

import pytest
import torch

from gradient.distill.config import DEARSettings, DistillSettings
from gradient.distill.methods import DistillInput, distill_method_names, method_spec, run_distill


def table(reward_B, **extra):
    # Two rollouts of two tokens (the second row's last token is padding).
    # student log-probs  [-1.0, -2.0], [-0.5, pad]
    # teacher log-probs  [-0.5, -1.0], [-1.5, pad]
    # reverse-KL advantage -(s - t): [0.5, 1.0], [-1.0, 0]; length-normalised return
    # G = [0.75, -1.0].
    return DistillInput(student_logp_B_T=torch.tensor([[-1.0, -2.0], [-0.5, 9.0]]),
                        teacher_logp_B_T=torch.tensor([[-0.5, -1.0], [-1.5, -9.0]]),
                        mask_B_T=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                        reward_adv_B=torch.tensor([0.5, -0.5]),
                        reward_B=torch.tensor(reward_B),
                        settings=DistillSettings(kl_coef=2.0, reward_coef=1.0), **extra)


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
    assert distill_method_names() == ["avsd", "dear", "dopsd", "gjsd", "opd", "ra_opd", "rstg",
                                      "w2s"]
    with pytest.raises(ValueError, match="choose one of avsd, dear, dopsd, gjsd, opd, ra_opd"):
        run_distill("gkd", table([1.0, 0.0]))


def test_rstg_distils_only_in_failed_groups_on_selected_tokens():
    # Row 0's group succeeded: its GRPO advantage 0.5 on both tokens. Row 1's group failed:
    # beta (5e-3 at step 0) * omega 0.5 * the reverse-KL advantage -1.0 on its one token,
    # which token_frac 0.2 still selects (ceil(0.2 * 1) = 1).
    out = run_distill("rstg", table([1.0, 0.0], entropy_B_T=torch.tensor([[1.0, 2.0], [1.0, 0.0]]),
                                    failed_B=torch.tensor([False, True]),
                                    omega_B=torch.tensor([1.0, 0.5])))
    torch.testing.assert_close(out.adv_B_T, torch.tensor([[0.5, 0.5], [-0.0025, 0.0]]))
    assert out.metrics["failed_frac"] == 0.5 and out.metrics["omega_mean"] == 0.5


def test_dear_weights_the_opd_advantage_towards_decisions():
    # q = 0.5: row 0's decision is its higher-entropy second token, row 1's its only token;
    # r = 0 leaves no evidence, so weights are w_decision 1 on decisions and w_other 0.1 on
    # row 0's first token, normalised by their mean (1 + 1 + 0.1) / 3 = 0.7.
    inp = table([1.0, 0.0], entropy_B_T=torch.tensor([[1.0, 2.0], [1.0, 0.0]]),
                hidden_B_T_H=torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0)))
    inp = DistillInput(**{**inp.__dict__, "settings": DistillSettings(
        kl_coef=2.0, reward_coef=1.0, dear=DEARSettings(q=0.5, r=0.0, w_other=0.1))})
    out = run_distill("dear", inp)
    w = torch.tensor([[0.1, 1.0], [1.0, 0.0]]) / 0.7
    torch.testing.assert_close(out.adv_B_T, torch.tensor([[1.5, 2.5], [-2.5, 0.0]]) * w)
    assert out.metrics["decision_frac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["gjsd", "w2s"])
def test_divergence_methods_leave_only_the_reward_advantage(name):
    out = run_distill(name, table([1.0, 0.0]))
    torch.testing.assert_close(out.adv_B_T, torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    from gradient.distill.scoring import teacher_divergence, w2s_divergence

    assert method_spec(name).divergence is {"gjsd": teacher_divergence,
                                            "w2s": w2s_divergence}[name]


def test_specs_declare_what_the_trainer_computes():
    assert method_spec("w2s").models == ("base", "positive", "negative")
    from gradient.distill.scoring import views_scorer

    assert method_spec("avsd").scorer is views_scorer and method_spec("avsd").models == ("base",)
    assert method_spec("dopsd").scorer is None
    from gradient.distill.rstg import sft_rows, solve_rate_inputs

    assert method_spec("rstg").birth_inputs is solve_rate_inputs
    assert method_spec("rstg").extra_rows is sft_rows
    settings = DistillSettings(dear=DEARSettings(layer=3))
    assert method_spec("dear").hidden_layer(settings) == 3
    assert method_spec("opd").hidden_layer is None and method_spec("opd").extra_rows is None
    assert method_spec("opd").divergence is None
