"""The diffusion log-prob estimators and dOPSD's targets, by hand on a scripted model, and
the masks they draw held fixed across the old and new passes of the trainer."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from es_llm.backends.diffusion import DiffusionTrace
from gradient.config import DiffusionRLSettings, GRPORunConfig
from gradient.distill.config import DOPSDSettings
from gradient.distill.opd import generalized_jsd
from gradient.dllm.estimators import (EstimateInput, _blockwise, estimate, scored_tokens,
                                      teacher_view_targets, trajectory_state, view_pair)

PAD, MASK, A, B = 0, 1, 2, 3


class CountMasks(torch.nn.Module):
    """Logits ``[0, 0, c, 0]`` at every position, c = the number of mask tokens in the row:
    so each log-prob tells how many positions its input had masked."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask):
        c_B = (input_ids == MASK).sum(-1).float() * self.w
        logits = torch.zeros(*input_ids.shape, 4)
        logits[..., A] = c_B[:, None]
        return type("Out", (), {"logits": logits})()


def lp(token: int, c: float) -> float:
    z = math.log(math.exp(c) + 3)
    return (c if token == A else 0.0) - z


def row(canvas, step_map, n=None, **extra):
    n = len(canvas) if n is None else n
    from gradient.loop.batch import Rollout

    return Rollout(prompt_ids=[A], completion_ids=list(canvas[:n]), engine_logp=None,
                   reward=0.0, correct=False, problem=None, group=0, mask_seed=7,
                   trace=DiffusionTrace(tuple(canvas), tuple(step_map)), **extra)


def inp(rows, **kw):
    base = dict(model=CountMasks(), rows=rows, temperature=1.0, pad_id=PAD, mask_id=MASK,
                settings=DiffusionRLSettings(estimator="trace"), block_length=2)
    return EstimateInput(**{**base, **kw})


def test_trace_scores_each_token_from_the_state_it_was_committed_in():
    r = row([A, B, A, B], [0, 0, 1, 2])
    e = estimate("trace", inp([r]))
    # Block 0, step 0: its two positions and block 1 masked (4); block 1, step 1: positions
    # 2 and 3 masked (2); step 2: position 3 alone (1).
    want = [lp(A, 4), lp(B, 4), lp(A, 2), lp(B, 1)]
    assert e.logp_B_T[0].tolist() == pytest.approx(want, abs=1e-6)
    assert e.mask_B_T[0].tolist() == [1, 1, 1, 1]


def test_trace_only_scores_the_completion_up_to_its_first_eos():
    r = row([A, B, A, B], [0, 0, 1, 2], n=3)
    e = estimate("trace", inp([r]))
    assert e.logp_B_T.shape == (1, 3) and e.mask_B_T[0].tolist() == [1, 1, 1]


def test_mean_field_masks_the_whole_canvas_and_a_seeded_share_of_the_prompt():
    r = row([A, B, A, B], [0, 1, 2, 3])
    settings = DiffusionRLSettings(estimator="mean_field", p_mask_prompt=0.0)
    e = estimate("mean_field", inp([r], settings=settings))
    assert e.logp_B_T[0].tolist() == pytest.approx([lp(A, 4), lp(B, 4)] * 2, abs=1e-6)
    # With a long prompt half masked: the same view draws the same mask, others differ.
    long = replace(r, prompt_ids=[A] * 64)
    settings = replace(settings, p_mask_prompt=0.5)
    counts = [float(estimate("mean_field", inp([long], settings=settings, view=v)).logp_B_T[0, 1].detach())
              for v in (0, 0, 1, 2)]
    assert counts[0] == counts[1] and len(set(counts[1:])) > 1


def test_blockwise_scoring_sees_earlier_blocks_clean_and_later_blocks_masked():
    r = row([A, B, A, B], [0, 1, 2, 3])
    noisy = torch.tensor([[True, False, False, True]])
    with torch.no_grad():
        e = _blockwise(inp([r]), noisy, noisy)
    # Position 0: itself and all of block 1 masked (3); position 3: only itself (1).
    assert e.mask_B_T[0].tolist() == [1, 0, 0, 1]
    assert float(e.logp_B_T[0, 0]) == pytest.approx(lp(A, 3), abs=1e-6)
    assert float(e.logp_B_T[0, 3]) == pytest.approx(lp(B, 1), abs=1e-6)


def test_quadrature_masks_are_frozen_per_rollout_and_level():
    rows = [row([A, B] * 8, list(range(16)), level=j) for j in range(3)]
    settings = DiffusionRLSettings(estimator="quadrature")
    x = inp(rows, settings=settings, block_length=4)
    first, again = estimate("quadrature", x), estimate("quadrature", x)
    assert torch.equal(first.mask_B_T, again.mask_B_T)
    assert torch.equal(first.logp_B_T, again.logp_B_T)
    assert scored_tokens("quadrature", x) == int(first.mask_B_T.sum())
    # Higher levels mask more (the Gauss-Legendre nodes are about 0.11, 0.5 and 0.89).
    assert first.mask_B_T[0].sum() < first.mask_B_T[2].sum()


def dopsd(**kw):
    return DOPSDSettings(**{"mask_threshold": 0.0, "step_select": "most", **kw})


def test_view_pairs_follow_the_settings():
    r = row([A, B, A, B], [0, 1, 2, 3])
    assert view_pair(r, dopsd(gap=1)) == (-1, [0])
    assert view_pair(r, dopsd(step_select="least", gap=5)) == (2, [3])
    assert view_pair(r, dopsd(teacher_view="final")) == (-1, [3])
    assert view_pair(r, dopsd(teacher_view="all_future")) == (-1, [0, 1, 2, 3])
    # Only states with more than half the completion masked: -1 (4/4) and 0 (3/4).
    assert view_pair(r, dopsd(mask_threshold=0.5, step_select="least"))[0] == 0


def test_recorded_states_agree_with_the_step_map():
    canvas, steps = [A, B, A, B], [1, 0, 3, 2]
    states = torch.tensor([[MASK, B, MASK, MASK], [A, B, MASK, MASK], [A, B, MASK, B],
                           [A, B, A, B]])
    recorded = DiffusionTrace(tuple(canvas), tuple(steps), states)
    rebuilt = DiffusionTrace(tuple(canvas), tuple(steps))
    for i in range(-1, 4):
        assert torch.equal(trajectory_state(recorded, i, MASK), trajectory_state(rebuilt, i, MASK))


def test_dopsd_teacher_sees_the_later_state_and_keeps_what_it_decoded():
    r = row([A, B, A, B], [0, 1, 2, 3])
    settings = dopsd(gap=1)
    target = teacher_view_targets(CountMasks(), [r], 4, 1.0, PAD, MASK, settings)
    # State 0 has position 0 decoded: one-hot there, c = 3 masks elsewhere.
    assert target[0, 0].exp().tolist() == pytest.approx([0, 0, 1, 0], abs=1e-6)
    assert float(target[0, 1, B]) == pytest.approx(lp(B, 3), abs=1e-6)
    student = estimate("student_view", inp([r], full=True, dopsd=settings))
    assert student.mask_B_T[0].tolist() == [1, 1, 1, 1]
    kl = generalized_jsd(student.logp_B_T_V, target, student.mask_B_T, 0.0)
    # Forward KL(T || S): at position 0, -log S(A) with all four masked.
    assert float(kl[0, 0].detach()) == pytest.approx(-lp(A, 4), abs=1e-5)
    # all_future averages one-hot and predictions over the later states.
    avg = teacher_view_targets(CountMasks(), [r], 4, 1.0, PAD, MASK,
                               dopsd(teacher_view="all_future"))
    p_b = (math.exp(lp(B, 3)) + 1 + 1 + 1) / 4  # masked only in state 0
    assert float(avg[0, 1, B].exp()) == pytest.approx(p_b, abs=1e-6)


def test_quadrature_rows_carry_the_level_weights():
    from gradient.dllm.estimators import estimator_spec
    from gradient.loop.batch import Rollout, RolloutBatch

    one = Rollout(prompt_ids=[1], completion_ids=[2, 3], engine_logp=None, reward=1.0,
                  correct=True, problem=None, group=0, adv=1.0)
    out = estimator_spec("quadrature").expand(RolloutBatch.of([one]),
                                              DiffusionRLSettings(estimator="quadrature",
                                                                  quadrature_points=3))
    assert [r.level for r in out] == [0, 1, 2] and all(r.adv == 1.0 for r in out)
    assert [r.row_weight for r in out] == pytest.approx([3 * 5 / 18, 3 * 8 / 18, 3 * 5 / 18])
    assert estimator_spec("trace").expand is None


@pytest.fixture(scope="module")
def diffusion_policy(tmp_path_factory):
    """A randomly initialised ci-shaped diffusion model saved with its sampler, and a
    six-problem countdown file."""
    from es_llm.io import SAMPLING_FILE
    from es_llm.testbed.config import load_testbed_config
    from es_llm.testbed.diffusion import make_diffusion_model
    from es_llm.testbed.tokenizer import build_tokenizer

    folder = tmp_path_factory.mktemp("dllm")
    cfg = load_testbed_config("ci")
    tok = build_tokenizer()
    model = make_diffusion_model(cfg, tok)
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    sampling = {"kind": "low_confidence", "gen_length": 16, "block_length": 8, "steps": 16,
                "tau": 0.9, "budget_m": 1.0}
    (folder / "model" / SAMPLING_FILE).write_text(json.dumps(sampling))
    problems = [{"id": f"p{i}", "prompt": f"nums {i + 1} 2 make {i + 3}\n", "numbers": [i + 1, 2],
                 "target": i + 3} for i in range(6)]
    (folder / "cd.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    return folder


@pytest.mark.parametrize("estimator,p_mask", [("mean_field", 0.5), ("quadrature", 0.15),
                                              ("trace", 0.15)])
def test_old_and_new_passes_see_the_same_masks(diffusion_policy, estimator, p_mask):
    """Two epochs with a frozen optimizer (lr 0): each epoch's new log-probs must equal the
    old ones frozen for it, so every ratio is exactly 1; for mean_field the two epochs use
    different masks (their frozen old log-probs differ)."""
    from es_llm.config import load_config
    from gradient.loop.batch import RolloutBatch
    from gradient.loop.birth_stages import StageInput
    from gradient.loop.plan import plan, run_birth
    from gradient.loop.rollouts import collect
    from gradient.loop.setup import build
    from gradient.loop.state import TrainerState
    from gradient.loop.trainer import policy_update

    cfg = load_config(GRPORunConfig, overrides=[
        f"model={diffusion_policy / 'model'}", "task.name=countdown",
        f"task.data={diffusion_policy / 'cd.jsonl'}", "backend=hf", "rollout.prompts_per_step=3",
        "rollout.group_size=2", "rollout.max_tokens=16", "algo.epochs=2",
        "algo.advantage=dr_grpo", "algo.is_correction.mode=none", "optim.lr=1e-30",
        "optim.weight_decay=0", "optim.warmup_steps=4", f"algo.dllm.estimator={estimator}",
        f"algo.dllm.p_mask_prompt={p_mask}"])
    edges, problems, _ = build(cfg)
    try:
        groups, _, _ = collect(edges, problems, cfg, 0, None, None)
        # Distinct advantages so the loss has a gradient to take.
        groups.rewards_P_G = torch.arange(6, dtype=torch.float64).view(3, 2)
        steps = plan(cfg, edges)
        rows, _ = run_birth(steps.birth, StageInput(edges, cfg, TrainerState()),
                            RolloutBatch.from_groups(groups, cfg.seed, 0))
        stats = policy_update(edges, rows, cfg, 0, steps)
        # Linear warmup: step 0 of 4 runs at a quarter of the learning rate.
        assert edges.optimizer.param_groups[0]["lr"] == pytest.approx(1e-30 / 4)
    finally:
        edges.task.close()
    assert stats["grad/updates"] == 2
    assert stats["grad/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["grad/approx_kl"] == pytest.approx(0.0, abs=1e-9)
    if estimator == "mean_field":
        assert all(len(r.old_views) == 2 for r in rows)
        assert any(r.old_views[0] != r.old_views[1] for r in rows)
