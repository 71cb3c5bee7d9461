"""Every shipped training config against figures recorded from the code before the rollout
batch and the stages were restructured (``tests/bitwise_runs.py``): bitwise the same weights,
the same metrics and, for ES, the same ledger after three steps on the ci testbeds. Then the
variant table: each GRPO-family config's policy moves and its defining statistic is
non-trivial."""

from __future__ import annotations

import json

import pytest

from bitwise_runs import CASES, REFERENCE, Case, Runs, build_testbeds, machine_key, weights_digest


@pytest.fixture(scope="module")
def testbeds():
    return build_testbeds()


@pytest.fixture(scope="module")
def runs(testbeds, tmp_path_factory):
    return Runs(testbeds, tmp_path_factory.mktemp("bitwise"))


@pytest.fixture(scope="module")
def reference(testbeds):
    key = machine_key(testbeds)
    recorded = json.loads(REFERENCE.read_text())
    if key not in recorded:
        pytest.skip(f"no figures recorded for this machine and these ci testbeds ({key}); "
                    f"floating-point bytes differ across CPU types. Record them from a commit "
                    f"before a change with: python tests/bitwise_runs.py --record")
    return recorded[key]


def test_every_shipped_training_config_has_a_case():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    trained = {p.name for p in configs.glob("*.yaml")
               if not p.name.startswith(("eval_", "experiment_", "latent_revise_", "scaling_"))}
    assert trained == {c.config for c in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.config)
def test_config_gives_the_recorded_weights_metrics_and_ledger(case, runs, reference):
    if case.config not in reference:
        pytest.skip(f"{case.config} has no figures recorded for this CPU type; record them "
                    f"from a commit before a change with: "
                    f"python tests/bitwise_runs.py --record-missing")
    _, got = runs.get(case)
    want = reference[case.config]
    assert got["weights"] == want["weights"]
    assert got.get("ledger") == want.get("ledger")
    assert len(got["metrics"]) == len(want["metrics"])
    for step, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        # Metrics added after the recording are allowed; every recorded one must be equal.
        assert {k: g.get(k) for k in w} == w, (case.config, step)


def _rows(runs, config: str, *extra: str) -> tuple[list[dict], str]:
    case = next(c for c in CASES if c.config == config)
    out, digests = runs.get(Case(case.config, case.command, case.model,
                                 (*case.overrides, *extra)))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()], \
        digests["weights"]


def _step0(runs, config: str, key: str) -> float:
    return _rows(runs, config)[0][0][key]


# config -> (overrides beyond the bitwise case, the variant's defining statistic)
VARIANTS = {
    "grpo_countdown.yaml": ((), lambda rows, runs: any(r["reward/std"] > 0 for r in rows)),
    # Dr. GRPO leaves the group mean out but not the scale; RLOO's leave-one-out baseline is
    # G/(G-1) times that, on the same step-0 rollouts.
    "grpo_dr_countdown.yaml": ((), lambda rows, runs: rows[0]["adv/abs_mean"] > 0),
    "grpo_rloo_countdown.yaml": ((), lambda rows, runs: rows[0]["adv/abs_mean"] == pytest.approx(
        4 / 3 * _step0(runs, "grpo_dr_countdown.yaml", "adv/abs_mean"), rel=1e-9)),
    # Clip-higher clips the ratio on its high side once a second mini-batch moves the ratio
    # off 1; dynamic sampling keeps fewer groups than it generated.
    # (At 16 tokens every rollout hits the overlong buffer, so the rewards have no spread.)
    "dapo_countdown.yaml": (("algo.mini_batches=2", "optim.lr=1e-2", "rollout.max_tokens=32",
                             "rollout.prompts_per_step=4"), lambda rows, runs:
                            any(r["grad/clipfrac_high"] > 0 for r in rows)
                            and any(r["reward/frac_zero_std"] > 0 for r in rows)),
    # GSPO's sequence ratio (tiny clip widths) is clipped on whole rows.
    "gspo_countdown.yaml": ((), lambda rows, runs: any(r["grad/clipfrac"] > 0 for r in rows)),
    # GAPO's upper bound is per row: wider for correct rollouts of groups with few of them.
    "gapo_countdown.yaml": (("task.name=anyseven",), lambda rows, runs:
                            any(r["gapo/clip_high_max"] > 0.003 for r in rows)),
    "adaprefix_countdown.yaml": ((), lambda rows, runs: rows[0]["prefix/fraction_mean"] > 0
                                 and rows[2]["prefix/fraction_mean"] == 0),
    "replay_countdown.yaml": ((), lambda rows, runs: rows[2]["replay/used"] > 0),
    # The adapter alone trains: its B starts at zero, so any gradient reaches B first.
    "grpo_lora_countdown.yaml": ((), lambda rows, runs: any(r["grad/grad_norm"] > 0
                                                            for r in rows)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(VARIANTS))
def test_variant_moves_the_policy_and_shows_its_statistic(config, runs, testbeds):
    extra, statistic = VARIANTS[config]
    rows, weights = _rows(runs, config, *extra)
    assert len(rows) == 3
    assert all(v == v for r in rows for v in r.values() if isinstance(v, float))  # no NaN
    assert weights != weights_digest(testbeds["student"])
    assert statistic(rows, runs), rows
