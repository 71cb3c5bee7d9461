"""The diffusion-LM methods end to end on the ci diffusion testbed: every shipped config
runs, d1 and TraceRL raise the reward, a SLIM-RL step climbs its own objective, dOPSD lowers
its divergence, bad pairings are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM

from es_llm.cli import main
from es_llm.config import load_config
from es_llm.io import read_jsonl
from gradient.config import GRPORunConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DLLM_CONFIGS = ["dllm_d1_countdown.yaml", "dllm_trace_countdown.yaml",
                "dllm_slim_countdown.yaml", "dllm_dopsd_countdown.yaml"]
DLLM_CI_CONFIGS = [c.replace(".yaml", "_ci.yaml") for c in DLLM_CONFIGS]
COMMAND = {"dllm_dopsd_countdown.yaml": "opd"}


def run(config: str, out: Path, model: Path, *overrides: str) -> int:
    command = COMMAND.get(config.replace("_ci", ""), "grpo")
    return main([command, "--config", str(CONFIGS / config), "--out", str(out),
                 "--no-progress", f"model={model}", *overrides])


@pytest.mark.parametrize("config", DLLM_CONFIGS)
def test_shipped_config_runs_and_saves_a_loadable_checkpoint(ci_diffusion, tmp_path, config):
    model = ci_diffusion / "diffusion"
    # The ci model solves almost nothing, so dynamic sampling would drop every group.
    small = ["steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
             "rollout.max_tokens=48", "algo.dynamic_sampling.enabled=false"]
    if "dopsd" in config:  # the ci model solves almost nothing: keep every rollout
        small.append("algo.distill.dopsd.filter_wrong=false")
    assert run(config, tmp_path / "r", model, *small) == 0
    metrics = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert len(metrics) == 1 and metrics[0]["grad/updates"] >= 1
    final = tmp_path / "r" / "checkpoints" / "final"
    assert type(AutoModelForMaskedLM.from_pretrained(final)).__name__ == "BertForMaskedLM"
    assert (final / "diffusion_sampling.json").is_file()


def test_mismatched_estimators_and_engines_are_refused(ci_diffusion, ci_testbed, tmp_path):
    model = ci_diffusion / "diffusion"
    # An autoregressive estimator on a diffusion model, and the reverse.
    assert run("grpo_countdown_ci.yaml", tmp_path / "a", model) == 2
    assert run("dllm_d1_countdown_ci.yaml", tmp_path / "b", ci_testbed) == 2
    assert run("dllm_d1_countdown_ci.yaml", tmp_path / "c", model, "backend=vllm") == 2
    assert run("dllm_trace_countdown_ci.yaml", tmp_path / "d", model,
               "rollout.max_tokens=8") == 2
    assert run("dllm_slim_countdown_ci.yaml", tmp_path / "e", model,
               "algo.replay.enabled=true") == 2
    assert run("dllm_d1_countdown_ci.yaml", tmp_path / "f", model,
               "algo.dllm.estimator=student_view") == 2
    assert not any((tmp_path / x / "checkpoints").exists() for x in "abcdef")


def _mean(values):
    return sum(values) / len(values)


def _gain(out: Path) -> float:
    """Mean reward of the last six steps minus that of the first six."""
    rewards = [m["reward/mean"] for m in read_jsonl(out / "metrics.jsonl")]
    return _mean(rewards[-6:]) - _mean(rewards[:6])


@pytest.mark.slow
@pytest.mark.parametrize("config", DLLM_CI_CONFIGS[:2])
def test_rl_methods_raise_the_reward(ci_diffusion, tmp_path, config):
    out = tmp_path / "r"
    assert run(config, out, ci_diffusion / "diffusion", *RISE) == 0
    assert _gain(out) > 0.02, [m["reward/mean"] for m in read_jsonl(out / "metrics.jsonl")]


def _surrogate(edges, batch, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Per rollout row: the sequence-mean log-likelihood under SLIM's quadrature masks, and
    the row's weight times its advantage (the direction the policy-gradient term climbs)."""
    from gradient.loop.estimates import policy_estimate

    with torch.no_grad():
        e = policy_estimate(edges, edges.model, batch, cfg, with_entropy=False)
    mask_B_T = e.mask_B_T.float()
    seq_mean_B = (e.logp_B_T * mask_B_T).sum(1) / mask_B_T.sum(1).clamp_min(1)
    weight_B = torch.tensor([r.row_weight * r.mean_adv() for r in batch])
    return seq_mean_B, weight_B


def test_a_slim_update_climbs_the_advantage_weighted_quadrature_likelihood(ci_diffusion):
    """SLIM-RL's reward rise needs four seeds of 24 steps to separate from noise (about ten
    minutes of CI; docs/benchmarks.md, "Diffusion-LM RL"). What is SLIM's own is the
    estimator; the loop it feeds is d1's and TraceRL's, whose reward rise is tested above.
    So: one real trainer step (its rollouts, rewards, advantages, quadrature rows and update)
    raises the advantage-weighted sequence-mean log-likelihood it was computed from, read
    again under the same frozen masks, and moves positive-advantage rows up against negative
    ones (flipping the advantage's sign in the policy term fails it; the masks' freezing is
    tested in test_dllm_estimators)."""
    from gradient.loop.batch import RolloutBatch
    from gradient.loop.plan import plan, run_birth
    from gradient.loop.birth_stages import StageInput
    from gradient.loop.rollouts import collect
    from gradient.loop.setup import build
    from gradient.loop.trainer import policy_update

    cfg = load_config(GRPORunConfig, path=CONFIGS / "dllm_slim_countdown_ci.yaml",
                      overrides=[f"model={ci_diffusion / 'diffusion'}",
                                 "rollout.prompts_per_step=8", "rollout.group_size=8",
                                 "task.format_weight=0.5"])
    edges, problems, state = build(cfg)
    steps = plan(cfg, edges)
    groups, _, _ = collect(edges, problems, cfg, 0, None, None)
    batch, _ = run_birth(steps.birth, StageInput(edges, cfg, state),
                         RolloutBatch.from_groups(groups, cfg.seed, 0))
    before_B, weight_B = _surrogate(edges, batch, cfg)
    assert len(batch) == 3 * 64 and (weight_B > 0).any() and (weight_B < 0).any()
    policy_update(edges, batch, cfg, 0, steps)
    after_B, _ = _surrogate(edges, batch, cfg)
    gain_B = after_B - before_B
    assert float((weight_B * gain_B).sum()) > 0, (weight_B, gain_B)
    assert float(gain_B[weight_B > 0].mean()) > float(gain_B[weight_B < 0].mean())
    edges.task.close()


@pytest.mark.slow
def test_dopsd_lowers_the_divergence_to_the_teacher_view(ci_diffusion, tmp_path):
    """The divergence between the student's and the teacher's view of the student's own
    rollouts, averaged over the first and the last six steps of a seeded run."""
    out = tmp_path / "r"
    assert run("dllm_dopsd_countdown_ci.yaml", out, ci_diffusion / "diffusion", *FALL) == 0
    metrics = read_jsonl(out / "metrics.jsonl")
    div = [m["distill/divergence"] for m in metrics]
    assert _mean(div[-6:]) < 0.97 * _mean(div[:6]), div
    assert all(m["distill/kept_frac"] == 1.0 for m in metrics)


# The ci model seldom solves a problem: the format share of the reward gives RL something
# to climb. Rewards are means over each step's 64 rollouts, so the first and last six steps
# are compared. (lr 1e-3 wiped the reward out after one step on every estimator.)
RISE = ["steps=24", "rollout.prompts_per_step=16", "task.format_weight=0.5", "optim.lr=2e-4"]
FALL = ["steps=30", "rollout.prompts_per_step=16", "optim.lr=1e-4", "optim.warmup_steps=10"]
