"""What ``es-llm latent-revise`` reports (``gradient.commands.recovery``): each arm's recovery
of the zero-hit prompts with its interval, the per-sample success rate it implies, its paired
difference to plain resampling at the same token passes and the break-even, the verdicts of
a soft continuation's two possible texts, and the log-likelihoods after the soft and the
hard-decoded prefix."""

from __future__ import annotations

import math

import numpy as np

from es_llm.metrics.passk import bootstrap_ci
from es_llm.report import Heading, Paragraph, Table, fixed, interval, pct, signed


def break_even_passes(recovery: float, per_sample: float, passes_per_sample: float
                      ) -> float | None:
    """The token passes per prompt at which plain resampling recovers a prompt as often as an
    arm does: ``n* = log(1 - r) / log(1 - p)`` samples (``1 - (1 - p)^n = r``) times a
    sample's passes, with ``r`` the arm's recovery rate and ``p`` resampling's per-sample
    success rate, as if every zero-hit prompt had the same ``p`` (prompts differ, so this is
    the break-even of the pooled rate). 0 where the arm recovers nothing; None where no
    number of samples reaches ``r`` (``p`` 0, or ``r`` 1 with ``p`` < 1)."""
    if recovery <= 0:
        return 0.0
    if per_sample <= 0 or (recovery >= 1 and per_sample < 1):
        return None
    if per_sample >= 1:
        return passes_per_sample
    return math.log1p(-recovery) / math.log1p(-per_sample) * passes_per_sample


def _rate(hits: list[bool], rng, resamples: int) -> dict:
    if not hits:
        return {"value": None, "ci95": None}
    lo, hi = bootstrap_ci(np.asarray(hits, dtype=float), rng, resamples)
    return {"value": float(np.mean(hits)), "ci95": [lo, hi]}


def _paired(a: list[bool], b: list[bool], rng, resamples: int) -> dict:
    """The mean of ``a - b`` over the same prompts with its 95% bootstrap interval."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if not len(diff):
        return {"value": None, "ci95": None}
    return {"value": float(diff.mean()), "ci95": list(bootstrap_ci(diff, rng, resamples))}


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def checked_steps(rows: list[dict]) -> float | None:
    """The share of Countdown trajectories whose every written step checks (the verifier's
    answer can be right after a garbled trace); None for other tasks or no rows."""
    from es_llm.tasks.countdown_roles import first_wrong_step

    rows = [r for r in rows if "numbers" in r and "target" in r]
    if not rows:
        return None
    return float(np.mean([first_wrong_step(r["numbers"], r["target"], r["completion"]) is None
                          for r in rows]))


def arm_hits(attempts: list[dict], zero: list[int], arm: str) -> list[bool]:
    """Per zero-hit prompt, whether one of ``arm``'s continuations was accepted."""
    got = {a["index"] for a in attempts for c in a[f"{arm}_continuations"] if c["correct"]}
    return [i in got for i in zero]


def arm_cost(attempts: list[dict], revise_cost: dict, arm: str) -> dict:
    """Each zero-hit prompt's token passes in ``arm``: its revisions' and that arm's
    continuations'."""
    cost = dict(revise_cost)
    for a in attempts:
        cost[a["index"]] += a[f"{arm}_passes"]
    return cost


def _arm(arm: str, hits: list[bool], attempts, zero, revise_cost, rs_hits, rs_sample, rs_pass,
         seconds, cfg, rng) -> dict:
    """One arm's figures; ``hits``: its ``arm_hits``; ``rs_*``: resampling's per-prompt hits,
    per-sample success rate and passes per sample."""
    conts = [c for a in attempts for c in a[f"{arm}_continuations"]]
    cost = arm_cost(attempts, revise_cost, arm)
    recovery = float(np.mean(hits)) if hits else 0.0
    verified = {key[len("correct_"):]: _mean([c[key] for c in conts])
                for key in sorted(conts[0]) if key.startswith("correct_")} if conts else {}
    return {
        "recovered": sum(hits), "recovery_rate": _rate(hits, rng, cfg.bootstrap),
        "continuations": len(conts), "per_sample_rate": _mean([c["correct"] for c in conts]),
        "verified_as": verified,
        "token_passes_mean": float(np.mean(list(cost.values()))) if zero else 0.0,
        "seconds": round(seconds["revision_s"] + seconds[f"{arm}_s"], 2),
        "difference": _paired(hits, rs_hits, rng, cfg.bootstrap),
        "break_even_passes": (break_even_passes(recovery, rs_sample, rs_pass)
                              if rs_sample is not None else None)}


def recovery_metrics(cfg, arm_names, problems, zero, attempts, recovered, resampled,
                     revise_cost, rs_cost, rs_tally, seconds, base_count) -> dict:
    """metrics.json: the zero-hit count, both arms (``latent_revise.arms``; the chosen one's
    figures also at the top of ``latent_revise``, and its difference to resampling as
    ``difference``; ``arm_names``: the registered arms), resampling, and the log-likelihood
    gains."""
    rng = np.random.default_rng(cfg.search.seed)
    rs_hits = [resampled[i] is not None for i in zero]
    rs_sample = (rs_tally["correct"] / rs_tally["samples"]) if rs_tally["samples"] else None
    rs_pass = sum(rs_cost.values()) / max(1, rs_tally["samples"])
    hits = {arm: arm_hits(attempts, zero, arm) for arm in arm_names}
    arms = {arm: _arm(arm, hits[arm], attempts, zero, revise_cost, rs_hits, rs_sample, rs_pass,
                      seconds, cfg, rng) for arm in arm_names}
    chosen = arms[cfg.revise.continue_from]
    # The gains from the rollout's own prefix (the first measurement) to the soft prefix
    # the revision ends at, and to its hard decoding.
    gain = [a["gold_logp"][-1] - a["gold_logp"][0] for a in attempts]
    drop = [a["fail_logp"][0] - a["fail_logp"][-1] for a in attempts]
    hard_gain = [a["hard_gold_logp"] - a["gold_logp"][0] for a in attempts]
    hard_drop = [a["fail_logp"][0] - a["hard_fail_logp"] for a in attempts]
    changed = sum(a["changed_tokens"] for a in attempts) / max(1, sum(a["prefix_tokens"]
                                                                      for a in attempts))
    return {
        "problems": len(problems), "zero_hit": len(zero),
        "zero_hit_share": len(zero) / max(1, len(problems)), "search_samples": cfg.search.n,
        "latent_revise": {
            "continue_from": cfg.revise.continue_from, "train_prefix": cfg.revise.train_prefix,
            "revisions": len(attempts),
            **{k: chosen[k] for k in ("recovered", "recovery_rate", "token_passes_mean",
                                      "seconds")},
            "revision_passes_mean": _mean([a["revision_passes"] for a in attempts]) or 0.0,
            "gold_logp_gain_mean": _mean(gain), "fail_logp_drop_mean": _mean(drop),
            "hard_gold_logp_gain_mean": _mean(hard_gain),
            "hard_fail_logp_drop_mean": _mean(hard_drop),
            "changed_token_share": changed, "checked_steps_share": checked_steps(recovered),
            "arms": arms,
            # Every pair of arms, paired over the zero-hit prompts (soft - hard).
            "arm_differences": {f"{x}-{y}": _paired(hits[x], hits[y], rng, cfg.bootstrap)
                                for x in arm_names for y in arm_names if x > y}},
        "resample": {
            "recovered": sum(rs_hits), "recovery_rate": _rate(rs_hits, rng, cfg.bootstrap),
            "samples": rs_tally["samples"], "per_sample_rate": rs_sample,
            "checked_steps_share": checked_steps([r for r in resampled.values() if r]),
            "token_passes_mean": float(np.mean(list(rs_cost.values()))) if zero else 0.0,
            "seconds": round(seconds["resample_s"], 2)},
        "difference": chosen["difference"],
        "base_rollouts": base_count, "search_s": round(seconds["search_s"], 2),
    }


def _diff(d: dict) -> str:
    return "-" if d["value"] is None else (
        interval(d["value"], d["ci95"], lambda x: signed(x, 1, 100)) + " pts")


def report_blocks(m: dict) -> list:
    """report.md's blocks: each arm's recovery with its interval, per-sample rate, difference
    to resampling and break-even; what the revisions changed; how many written traces check
    step by step."""
    lr, rs = m["latent_revise"], m["resample"]
    rate = lambda r: interval(r["value"], r["ci95"], pct)  # noqa: E731
    passes = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    own = lambda arm: " (the run's)" if arm == lr["continue_from"] else ""  # noqa: E731
    rows = [[f"LatentRevise, {arm} continuation{own(arm)}", str(a["recovered"]),
             rate(a["recovery_rate"]), pct(a["per_sample_rate"]),
             f"{a['token_passes_mean']:.0f}", _diff(a["difference"]),
             passes(a["break_even_passes"]), f"{a['seconds']:.1f}"]
            for arm, a in lr["arms"].items()]
    rows.append(["plain resampling", str(rs["recovered"]), rate(rs["recovery_rate"]),
                 pct(rs["per_sample_rate"]), f"{rs['token_passes_mean']:.0f}", "", "",
                 f"{rs['seconds']:.1f}"])
    soft = lr["arms"].get("soft", {}).get("verified_as", {})
    return [
        Heading(1, "LatentRevise: recovery of zero-hit prompts"),
        Paragraph(f"{m['zero_hit']} of {m['problems']} prompts are zero-hit in "
                  f"{m['search_samples']} samples ({pct(m['zero_hit_share'])})."),
        Table(["arm", "recovered", "rate [95% CI]", "per sample", "token passes per prompt",
               "minus resampling (paired)", "break-even passes", "seconds"], rows),
        *[Paragraph(f"LatentRevise {pair.replace('-', ' minus ')} continuation: "
                    f"{_diff(d)} (paired over zero-hit prompts).")
          for pair, d in lr["arm_differences"].items()],
        Paragraph("Per sample: the share of continuations (or of resamples) the verifier "
                  "accepts. Break-even: the token passes per prompt at which plain "
                  "resampling, at its pooled per-sample rate, would recover as often as the "
                  "arm; an arm spending fewer passes than that beats resampling."),
        Paragraph("A soft continuation follows a prefix that has no text; its trajectory is "
                  f"written with the {lr['train_prefix']} prefix. Continuations the verifier "
                  f"accepts as text with the rollout's original prefix: "
                  f"{pct(soft.get('original'))}; with the hard-decoded prefix: "
                  f"{pct(soft.get('hard'))}."),
        Paragraph(f"Revisions: {lr['revisions']}; the gold continuation's log-likelihood rose "
                  f"by {fixed(lr['gold_logp_gain_mean'], 2)} nats and the failed one's fell by "
                  f"{fixed(lr['fail_logp_drop_mean'], 2)} nats on average after the soft "
                  f"prefix; after its hard decoding they moved by "
                  f"{fixed(lr['hard_gold_logp_gain_mean'], 2)} and "
                  f"{fixed(lr['hard_fail_logp_drop_mean'], 2)} nats; "
                  f"{pct(lr['changed_token_share'])} of prefix tokens changed."),
        Paragraph(f"Written trajectories whose every step checks (the answer alone decides the "
                  f"verdict): LatentRevise {pct(lr['checked_steps_share'])}, resampling "
                  f"{pct(rs['checked_steps_share'])}.")]
