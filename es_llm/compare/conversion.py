"""A conversion study's table: the "conversion" section of a comparison (SWARR's sliding
window, ``configs/experiment_swarr.yaml``).

SWARR (Liu, Dong, Xie et al., arXiv 2606.11634) converts a full-attention model to sliding-
window attention, fine-tunes it, then trains it with RL under the window, and measures RL by
the share of the conversion's loss it wins back. Per arm (the model before the conversion,
the converted model, RL under the conversion, and the same RL on the unconverted model) and
per tier of the problems (their ``difficulty`` field: the count of numbers of a Countdown
problem), this section gives pass@1 (seed means of the per-problem accuracy ``c_i / n``) and
both framings:

- the recovered share ``(p_rl - p_converted) / (p_full - p_converted)``, the source's
  yardstick; undefined when the conversion lost nothing (``p_full <= p_converted``), which
  the table says rather than divide by zero or a gain;
- ``p_rl - p_rl_full``, RL under the conversion against RL without it (stricter: RL may
  improve the unconverted model too).

Each comes with a 95% percentile bootstrap interval over the row's problems, every model's
values resampled with the same problems (paired); a resample in which the conversion lost
nothing leaves the share undefined and is left out of the interval, and the row counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from es_llm.compare.section import SECTIONS, CheckInput, Section, SectionInput, fields_dict
from es_llm.errors import BadInput
from es_llm.metrics.bootstrap import percentile_interval
from es_llm.report import Heading, Paragraph, Table, difference, in_points, interval, pct

# The four roles of an arm, in the table's order.
ROLES = ("full", "converted", "rl", "rl_full")


def recovered_share(full_P, converted_P, rl_P) -> float | None:
    """The share of the conversion's loss that RL wins back.

    Args:
        full_P, converted_P, rl_P: per-problem pass@1 of the model before the conversion,
            the converted model and RL under the conversion, on the same P problems.
    Returns: ``(mean rl - mean converted) / (mean full - mean converted)``: 1 = everything
        recovered, 0 = nothing, negative = RL lost more, above 1 = RL went past the
        unconverted model; None when the conversion lost nothing (``mean full <= mean
        converted``), where the share is undefined.
    """
    loss = float(np.mean(full_P)) - float(np.mean(converted_P))
    if not loss > 0:
        return None
    return (float(np.mean(rl_P)) - float(np.mean(converted_P))) / loss


def _share_R(x_F_R_P: np.ndarray) -> np.ndarray:
    """``recovered_share`` of each resample (rows full, converted, rl); NaN where the
    resample's conversion lost nothing."""
    m_F_R = x_F_R_P.mean(axis=-1)
    loss_R, gain_R = m_F_R[0] - m_F_R[1], m_F_R[2] - m_F_R[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(loss_R > 0, gain_R / loss_R, np.nan)


def share_with_ci(full_P, converted_P, rl_P, rng: np.random.Generator,
                  num_resamples: int) -> dict:
    """``recovered_share`` with its paired percentile bootstrap 95% interval over problems.

    Returns: ``{"value", "ci95", "loss", "gain", "undefined_resamples"}``: the share (None
    when the conversion lost nothing on these problems, and then no interval), the
    conversion's loss ``mean full - mean converted`` and RL's gain ``mean rl - mean
    converted``, and how many resamples left the share undefined (left out of the
    interval)."""
    rows_F_P = np.stack([np.asarray(v, np.float64) for v in (full_P, converted_P, rl_P)])
    value = recovered_share(*rows_F_P)
    out = {"value": value, "ci95": None,
           "loss": float(rows_F_P[0].mean() - rows_F_P[1].mean()),
           "gain": float(rows_F_P[2].mean() - rows_F_P[1].mean()), "undefined_resamples": 0}
    if value is None:
        return out
    undefined = [0]

    def statistic(x_F_R_P):
        share_R = _share_R(x_F_R_P)
        undefined[0] += int(np.isnan(share_R).sum())
        return share_R

    lo, hi = percentile_interval(rows_F_P, statistic, rng, num_resamples, 0.95)
    out["ci95"] = [float(lo), float(hi)]
    out["undefined_resamples"] = undefined[0] if rows_F_P.shape[1] > 1 else 0
    return out


def paired_difference(a_P, b_P, rng: np.random.Generator, num_resamples: int) -> dict:
    """``mean a - mean b`` over the same problems with its percentile bootstrap 95%
    interval (problems resampled, the pairs kept)."""
    diff_P = np.asarray(a_P, np.float64) - np.asarray(b_P, np.float64)
    lo, hi = percentile_interval(diff_P, lambda x_R_P: x_R_P.mean(axis=-1), rng,
                                 num_resamples, 0.95)
    return {"diff": float(diff_P.mean()), "ci95": [float(lo), float(hi)]}


def arm_rows(pass1: dict[str, np.ndarray], tiers_P: list, rng: np.random.Generator,
             num_resamples: int) -> list[dict]:
    """One row per tier and one for all problems.

    Args:
        pass1: per role (``ROLES``; ``rl_full`` may be missing) the per-problem pass@1,
            aligned with ``tiers_P``.
        tiers_P: each problem's tier.
    Returns: per row ``{"tier", "problems", "pass1": {role: value}, "share":
        share_with_ci(...), "vs_rl_full": paired_difference(rl, rl_full) | None}``.
    """
    tiers = sorted(set(tiers_P), key=lambda t: (isinstance(t, str), t))
    groups = [(str(t), np.array([x == t for x in tiers_P])) for t in tiers]
    rows = []
    for label, mask_P in groups + [("all", np.ones(len(tiers_P), bool))]:
        pick = {role: values_P[mask_P] for role, values_P in pass1.items()}
        rows.append({
            "tier": label, "problems": int(mask_P.sum()),
            "pass1": {role: float(values_P.mean()) for role, values_P in pick.items()},
            "share": share_with_ci(pick["full"], pick["converted"], pick["rl"], rng,
                                   num_resamples),
            "vs_rl_full": (paired_difference(pick["rl"], pick["rl_full"], rng, num_resamples)
                           if "rl_full" in pick else None)})
    return rows


# --- the section -------------------------------------------------------------------------------

def _names(inp: CheckInput | SectionInput) -> tuple[set[str], set[str]]:
    models = {s.name for s in inp.sources}
    return models, {m.split("@")[0] for m in models}


def check(inp: CheckInput) -> None:
    """BadInput when an arm names a model that is not compared."""
    models, methods = _names(inp)
    for label, arm in inp.cfg.conversion.items():
        missing = [getattr(arm, r) for r in ROLES
                   if getattr(arm, r) and getattr(arm, r) not in models | methods]
        if missing:
            raise BadInput(f"conversion arm {label} names {', '.join(map(repr, missing))}, "
                           f"which {'is' if len(missing) == 1 else 'are'} not compared here "
                           f"(models: {', '.join(sorted(models))}); name compared models or "
                           f"methods.")


def _pass1_P(inp: SectionInput, name: str) -> np.ndarray:
    """Per-problem pass@1 of the model ``name``, or the seed mean of the method ``name``."""
    sets = [s for s in inp.sets if s.name == name] or [s for s in inp.sets if s.method == name]
    return np.mean([[float(np.mean(c)) for c in s.correct] for s in sets], axis=0)


@dataclass(frozen=True)
class Conversion:
    """comparison.json["conversion"]: per arm its models (by role) and its rows."""

    arms: dict

    def to_json(self) -> dict:
        return {"conversion": fields_dict(self)["arms"]}


def compute(inp: SectionInput) -> Conversion:
    tiers_P = list(inp.sets[0].difficulties)
    rng = inp.rng()
    arms = {}
    for label, arm in inp.cfg.conversion.items():
        names = {r: getattr(arm, r) for r in ROLES if getattr(arm, r)}
        pass1 = {r: _pass1_P(inp, name) for r, name in names.items()}
        arms[label] = {"models": names,
                       "rows": arm_rows(pass1, tiers_P, rng, inp.cfg.bootstrap)}
    return Conversion(arms)


def _share_cell(share: dict) -> str:
    if share["value"] is None:
        return f"- (no conversion loss: {in_points(share['loss'])} pts)"
    cell = interval(share["value"], share["ci95"], pct)
    return cell + (f" ({share['undefined_resamples']} resamples undefined)"
                   if share["undefined_resamples"] else "")


def blocks(comp: dict, figures: dict[str, str]) -> list:
    out: list = [Heading(2, "Conversion: what RL wins back"), Paragraph(
        "Per arm and per tier: pass@1 (seed means of c/n) of the model before the conversion "
        "(full), the converted model, RL under the conversion (rl) and the same RL on the "
        "unconverted model (rl full). Recovered: (rl - converted) / (full - converted), the "
        "share of the conversion's loss RL wins back (100% = all of it; '-' where the "
        "conversion lost nothing). rl - rl full: RL under the conversion against RL without "
        "it. Paired 95% bootstrap intervals over each row's problems.")]
    for label, arm in comp["conversion"].items():
        models = arm["models"]
        header = ["tier", "problems"] + [f"{models[r]} ({r.replace('_', ' ')})"
                                         for r in ROLES if r in models]
        header.append("recovered [95% CI]")
        if "rl_full" in models:
            header.append(f"{models['rl']} - {models['rl_full']} [95% CI]")
        rows = []
        for row in arm["rows"]:
            cells = [row["tier"], str(row["problems"])]
            cells += [pct(row["pass1"][r]) for r in ROLES if r in models]
            cells.append(_share_cell(row["share"]))
            if row["vs_rl_full"] is not None:
                d = row["vs_rl_full"]
                cells.append(difference(d["diff"], d["ci95"], in_points) + " pts")
            rows.append(cells)
        out += [Heading(3, label), Table(header, rows)]
    return out


SECTIONS.register("conversion")(Section(
    place=160, enabled=lambda cfg: bool(cfg.conversion), check=check, compute=compute,
    blocks=blocks))
