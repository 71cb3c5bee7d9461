"""The typed rollout batch and the stage plan: padding by hand, frozen rollouts, the stages and
terms each kind of config gets, and no method name compared in the loop's modules."""

from __future__ import annotations

import ast
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from es_llm.config import load_config
from gradient.config import GRPORunConfig
from gradient.loop.batch import Rollout, RolloutBatch
from gradient.loop.birth_stages import BIRTH, Stage, StageInput
from gradient.loop.plan import BIRTH_ORDER, plan

ROOT = Path(__file__).resolve().parents[1]


def rollout(n: int, **kw) -> Rollout:
    base = dict(prompt_ids=[1], completion_ids=list(range(2, 2 + n)), engine_logp=[-1.0] * n,
                reward=0.0, correct=False, problem=None, group=0)
    return Rollout(**{**base, **kw})


def test_padded_broadcasts_the_sequence_advantage_over_the_estimates_mask():
    batch = RolloutBatch.of([rollout(3, adv=2.0), rollout(1, adv=-0.5)])
    mask_B_T = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # the estimator's mask
    p = batch.padded(mask_B_T, view=0)
    assert p.adv_B_T.shape == (2, 3)
    assert (p.adv_B_T * mask_B_T).tolist() == [[2.0, 2.0, 0.0], [-0.5, 0.0, 0.0]]
    assert p.old_logp_B_T is None and p.ref_logp_B_T is None and p.clip_high_B is None
    assert p.row_weight_B is None


def test_padded_takes_per_token_advantages_frozen_views_and_row_fields():
    a = rollout(2, adv=[0.5, 0.25], old_logp=[-1.0, -2.0], is_weight=[1.0, 0.5],
                old_views=([-1.0, -2.0], [-3.0, -4.0]), ref_logp=[-0.5, -0.5],
                clip_high=0.3, row_weight=1.5)
    b = rollout(1, adv=[4.0], old_logp=[-7.0], is_weight=[1.0],
                old_views=([-7.0], [-8.0]), ref_logp=[-0.25], clip_high=0.2, row_weight=0.5)
    p = RolloutBatch.of([a, b]).padded(torch.ones(2, 2), view=1)
    assert p.adv_B_T.tolist() == [[0.5, 0.25], [4.0, 0.0]]
    assert p.old_logp_B_T.tolist() == [[-3.0, -4.0], [-8.0, 0.0]]  # the view's frozen values
    assert p.is_weight_B_T.tolist() == [[1.0, 0.5], [1.0, 0.0]]
    assert p.ref_logp_B_T.tolist() == [[-0.5, -0.5], [-0.25, 0.0]]
    assert p.clip_high_B.dtype == torch.float64 and p.clip_high_B.tolist() == [0.3, 0.2]
    assert p.row_weight_B.tolist() == [1.5, 0.5]


def test_rollouts_are_frozen_and_stages_return_new_ones():
    r = rollout(2)
    with pytest.raises(FrozenInstanceError):
        r.adv = 1.0
    batch = RolloutBatch.of([r])
    out = batch.with_fields([{"adv": 3.0}])
    assert out[0].adv == 3.0 and r.adv == 0.0 and len(out[0:1]) == 1
    assert Rollout.from_saved({**vars(r), "unknown_key": 1}) == r  # an older saved state
    # Before the advantage was one field, per-token values were a second one.
    old = Rollout.from_saved({**vars(r), "adv_tokens": [0.5, 0.25], "sft": True})
    assert old.adv == [0.5, 0.25] and old.per_token() and old.mean_adv() == 0.375
    assert not r.per_token() and r.mean_adv() == 0.0


def test_the_advantage_stage_normalises_within_groups_of_g():
    cfg = load_config(GRPORunConfig, overrides=["rollout.group_size=2"])
    batch = RolloutBatch.of([rollout(1, reward=x) for x in (1.0, 0.0, 0.5, 0.5)])
    out, metrics = BIRTH.get("advantages").fn(StageInput(None, cfg, None), batch)
    adv = [r.adv for r in out]
    # GRPO: (r - mean) / (std + eps) per group of 2; the second group has no spread.
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] > 0.7 and adv[2:] == [0.0, 0.0]
    assert metrics["adv/abs_mean"] == pytest.approx(sum(abs(a) for a in adv) / 4)


def _plan(config: str, *overrides: str, ref=None, teachers=None):
    cfg = load_config(GRPORunConfig, path=ROOT / "configs" / config, overrides=list(overrides))
    return plan(cfg, SimpleNamespace(ref_model=ref, teachers=teachers or {}))


def test_each_kind_of_config_gets_its_stages_and_terms():
    p = _plan("grpo_countdown.yaml", "algo.is_correction.mode=none")
    assert p.birth == ("advantages",) and p.terms == ("policy", "entropy")
    assert not p.full and not p.gated
    # A sampler/trainer mismatch correction needs the behaviour log-probs frozen.
    assert _plan("grpo_countdown.yaml", "algo.is_correction.mode=token_truncate").birth == (
        "advantages", "freeze_behaviour")
    assert "row_clip_bounds" in _plan("gapo_countdown.yaml").birth
    assert "freeze_behaviour" in _plan("gapo_countdown.yaml").birth  # two mini-batches
    assert _plan("replay_countdown.yaml").birth[-1] == "replay"
    assert "estimator_rows" in _plan("dllm_slim_countdown.yaml").birth
    gjsd = _plan("opd_gjsd_countdown.yaml", teachers={"teacher": object()})
    assert "distill" in gjsd.birth and "divergence" in gjsd.terms and gjsd.full
    assert _plan("opd_drift_countdown.yaml", teachers={"teacher": object()}).gated
    kl = _plan("grpo_countdown.yaml", "algo.kl.coef=0.1", ref=object())
    assert kl.terms == ("policy", "entropy", "kl") and "freeze_reference" in kl.birth


def test_a_stage_without_a_place_in_the_order_fails_at_plan_time():
    stage = Stage(lambda inp, batch: (batch, {}), when=lambda cfg, edges: False)
    with BIRTH.registered("unplaced", stage), pytest.raises(ValueError, match="unplaced"):
        _plan("grpo_countdown.yaml")


def test_an_order_naming_an_unregistered_stage_or_term_fails_at_plan_time(monkeypatch):
    import gradient.loop.plan as plan_module

    monkeypatch.setattr(plan_module, "BIRTH_ORDER", BIRTH_ORDER + ("typo",))
    with pytest.raises(ValueError, match="typo"):
        _plan("grpo_countdown.yaml")
    monkeypatch.undo()
    monkeypatch.setattr(plan_module, "TERM_ORDER", ("policy", "entropy", "kl"))
    with pytest.raises(ValueError, match="divergence"):
        _plan("grpo_countdown.yaml")


def _method_names() -> set[str]:
    from gradient.distill.methods import distill_method_names
    from gradient.dllm.estimators import estimator_names
    from gradient.maths.advantages import advantage_names
    from gradient.maths.aggregation import aggregation_names
    from gradient.maths.kl import kl_names
    from gradient.maths.losses import loss_names

    return {"none", *advantage_names(), *aggregation_names(), *distill_method_names(),
            *estimator_names(), *kl_names(), *loss_names()}


@pytest.mark.parametrize("module", ["gradient/loop/trainer.py", "gradient/distill/birth.py",
                                    "gradient/distill/scoring.py", "gradient/loop/plan.py",
                                    "gradient/loop/birth_stages.py",
                                    "gradient/loop/loss_terms.py"])
def test_no_method_name_is_compared_in_the_loop(module):
    names = _method_names()
    tree = ast.parse((ROOT / module).read_text())
    compared = {node.value for cmp in ast.walk(tree) if isinstance(cmp, ast.Compare)
                for node in ast.walk(cmp) if isinstance(node, ast.Constant)
                and isinstance(node.value, str)}
    assert not compared & names, f"{module} compares {sorted(compared & names)}"


def test_dropped_fields_stay_typed():
    """A field a stage sets must be one the Rollout declares (a typo fails at once)."""
    with pytest.raises(TypeError):
        replace(rollout(1), advantage=1.0)
