"""The test-time report: success against generated tokens, the frontier, and each method's
own statistics (``report.md`` and ``figures/success_vs_tokens.png``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

from es_llm.io import write_text_atomic  # noqa: E402

MEASURES = {"covered": "some output correct (oracle verifier)",
            "answered": "committed answer correct"}


def success_figure(curves_by_label: dict[str, dict], path: Path, title: str = "") -> None:
    """Two panels (covered, answered) of success against mean tokens per problem (log
    axis); ``curves_by_label[label] = summary`` of one model's methods, labels prefixed
    when several models share the figure."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, measure in zip(axes, MEASURES):
        for label, runs in curves_by_label.items():
            pts = sorted((r["tokens_mean"], r[measure]["value"]) for r in runs["budgets"].values())
            ax.plot([t for t, _ in pts], [s for _, s in pts], marker="o", ms=3, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("mean tokens per problem (generated + scored)")
        ax.set_title(MEASURES[measure], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ci(r: dict) -> str:
    return f"{r['value']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


def _ci_signed(r: dict) -> str:
    return f"{r['value']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"


def _stat(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_stat(v)}" for k, v in value.items() if not isinstance(v, list))
    return str(value)


def report_text(metrics: dict) -> str:
    cfg = metrics["config"]
    lines = [f"# Test-time methods on {cfg['model']}", "",
             f"{cfg['problems']} {cfg['task']} problems, backend {cfg['backend']}, "
             f"{metrics['perf']['generations']} generations, "
             f"{metrics['perf']['generated_tokens']} generated tokens, "
             f"{metrics['perf']['wall_s']} s.", "",
             "Cost is tokens per problem: generated, plus those read by scoring passes "
             "(ttel's localisation). `covered`: some output is correct (what an oracle "
             "verifier would find, metrics.md 5.1); `answered`: the one answer the method "
             "commits to (the vote of its samples; dart's agreed draft; base_select's first "
             "pass) is correct. 95% bootstrap intervals over problems.", "",
             "| method | budget | tokens | generated | scored | covered | answered |",
             "|---|---:|---:|---:|---:|---|---|"]
    for name, runs in metrics["methods"].items():
        for b, r in runs["budgets"].items():
            lines.append(f"| {name} | {b} {runs['unit']} | {r['tokens_mean']:.1f} | "
                         f"{r['generated_tokens_mean']:.1f} | {r['scored_tokens_mean']:.1f} | "
                         f"{_ci(r['covered'])} | {_ci(r['answered'])} |")
    for measure, text in MEASURES.items():
        c = metrics["curves"][measure]
        lines += ["", f"## Frontier and area: {text}", "",
                  "Pareto frontier (tokens, success): " + ", ".join(
                      f"{p['point']} ({p['tokens']:.0f}, {p['success']:.3f})" for p in c["frontier"]),
                  "", f"Area under S(b) on log10 tokens over [{c['range'][0]:.0f}, "
                      f"{c['range'][1]:.0f}], as mean success:", ""]
        lines += [f"- {m}: {v:.3f}" for m, v in sorted(c["auc_log_tokens"].items(),
                                                       key=lambda kv: -kv[1])]
        diffs = c.get("auc_minus_independent")
        if diffs:
            lines += ["", "Area minus independent sampling's, paired 95% bootstrap interval "
                          "over problems (a difference only where it excludes 0):", ""]
            lines += [f"- {m}: {_ci_signed(d)}" + (" (excludes 0)" if d["ci95"][0] > 0 or
                                                    d["ci95"][1] < 0 else "")
                      for m, d in diffs.items()]
        dom = c["dominates"]
        lines += ["", "Dominance (at least as good at every budget, better somewhere): "
                  + ("; ".join(f"{a} over {b}" for a, b in dom) if dom else "none.")]
    lines += ["", "## Each method's statistics", ""]
    for name, runs in metrics["methods"].items():
        for b, r in runs["budgets"].items():
            if r["stats"]:
                lines.append(f"- {name} @ {b}: " + "; ".join(
                    f"{k} {_stat(v)}" for k, v in r["stats"].items()))
    lines += ["", "![success vs tokens](figures/success_vs_tokens.png)", ""]
    return "\n".join(lines)


def write_report(metrics: dict, out: Path) -> str:
    success_figure(metrics["methods"], out / "figures" / "success_vs_tokens.png")
    text = report_text(metrics)
    write_text_atomic(out / "report.md", text)
    return text
