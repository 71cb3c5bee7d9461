"""The test-time report: success against generated tokens, the frontier, and each method's
own statistics (``report.md``, ``report.html`` and ``figures/success_vs_tokens.png``)."""

from __future__ import annotations

from pathlib import Path

from es_llm.report import (Bullets, Figure, Heading, Paragraph, Table, fixed, interval, pyplot,
                           save_figure, signed, write_report as write_pages)

MEASURES = {"covered": "some output correct (oracle verifier)",
            "answered": "committed answer correct"}


def curve_styles(n: int) -> list[dict]:
    """``n`` distinct line styles: matplotlib's ten default colours, then the same colours
    dashed with another marker (and dotted after twenty), so that eleven or more methods on
    one figure stay apart."""
    return [{"color": f"C{i % 10}", "marker": "os^Dv"[i // 10 % 5],
             "linestyle": ("-", "--", ":")[i // 10 % 3]} for i in range(n)]


def success_figure(curves_by_label: dict[str, dict], path: Path, title: str = "") -> str:
    """Two panels (covered, answered) of success against mean tokens per problem (log
    axis); ``curves_by_label[label] = summary`` of one model's methods, labels prefixed
    when several models share the figure. Returns the file's name."""
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    styles = curve_styles(len(curves_by_label))
    for ax, measure in zip(axes, MEASURES):
        for style, (label, runs) in zip(styles, curves_by_label.items()):
            pts = sorted((r["tokens_mean"], r[measure]["value"]) for r in runs["budgets"].values())
            ax.plot([t for t, _ in pts], [s for _, s in pts], ms=3, label=label, **style)
        ax.set_xscale("log")
        ax.set_xlabel("mean tokens per problem (generated + scored)")
        ax.set_title(MEASURES[measure], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[1].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path)


def _stat(value) -> str:
    if isinstance(value, float):
        return fixed(value, 3)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_stat(v)}" for k, v in value.items() if not isinstance(v, list))
    return str(value)


def _frontier_blocks(measure: str, text: str, c: dict) -> list:
    """One measure's Pareto frontier, areas, area differences and dominance."""
    out: list = [Heading(2, f"Frontier and area: {text}"),
                 Paragraph("Pareto frontier (tokens, success): " + ", ".join(
                     f"{p['point']} ({p['tokens']:.0f}, {p['success']:.3f})"
                     for p in c["frontier"])),
                 Paragraph(f"Area under S(b) on log10 tokens over [{c['range'][0]:.0f}, "
                           f"{c['range'][1]:.0f}], as mean success:"),
                 Bullets([f"{m}: {v:.3f}" for m, v in sorted(c["auc_log_tokens"].items(),
                                                             key=lambda kv: -kv[1])])]
    diffs = c.get("auc_minus_independent")
    if diffs:
        out += [Paragraph("Area minus independent sampling's, paired 95% bootstrap interval "
                          "over problems (a difference only where it excludes 0):"),
                Bullets([f"{m}: {interval(d['value'], d['ci95'], lambda x: signed(x, 3))}"
                         + (" (excludes 0)" if d["ci95"][0] > 0 or d["ci95"][1] < 0 else "")
                         for m, d in diffs.items()])]
    dom = c["dominates"]
    out.append(Paragraph("Dominance (at least as good at every budget, better somewhere): "
                         + ("; ".join(f"{a} over {b}" for a, b in dom) if dom else "none.")))
    return out


def report_blocks(metrics: dict, figure: str) -> list:
    cfg = metrics["config"]
    three = lambda x: fixed(x, 3)  # noqa: E731
    rows = [[name, f"{b} {runs['unit']}", f"{r['tokens_mean']:.1f}",
             f"{r['generated_tokens_mean']:.1f}", f"{r['scored_tokens_mean']:.1f}",
             interval(r["covered"]["value"], r["covered"]["ci95"], three),
             interval(r["answered"]["value"], r["answered"]["ci95"], three)]
            for name, runs in metrics["methods"].items() for b, r in runs["budgets"].items()]
    out: list = [
        Heading(1, f"Test-time methods on {cfg['model']}"),
        Paragraph(f"{cfg['problems']} {cfg['task']} problems, backend {cfg['backend']}, "
                  f"{metrics['perf']['generations']} generations, "
                  f"{metrics['perf']['generated_tokens']} generated tokens, "
                  f"{metrics['perf']['wall_s']} s."),
        Paragraph("Cost is tokens per problem: generated, plus those read by scoring passes "
                  "(ttel's localisation). `covered`: some output is correct (what an oracle "
                  "verifier would find, metrics.md 5.1); `answered`: the one answer the method "
                  "commits to (the vote of its samples; dart's agreed draft; ttel's vote of "
                  "its branches, with the first branch the verifier accepts beside it as "
                  "answered_by_checker in its statistics; the first pass of base_select, "
                  "formalize_all and base_oracle) is "
                  "correct. 95% bootstrap intervals over problems."),
        Table(["method", "budget", "tokens", "generated", "scored", "covered", "answered"],
              rows, align="lrrrrll")]
    for measure, text in MEASURES.items():
        out += _frontier_blocks(measure, text, metrics["curves"][measure])
    if metrics.get("pairs"):
        out += [Heading(2, "Paired comparisons"),
                Paragraph("A minus B on the same problems at each budget, paired 95% bootstrap "
                          "intervals over problems: the committed answer correct, and tokens "
                          "per problem."),
                Table(["A", "B", "budget", "answered A / B", "answered A - B", "tokens A / B",
                       "tokens A - B"],
                      [[p["first"], p["second"], str(p["budget"]),
                        f"{p['answered']['first']:.3f} / {p['answered']['second']:.3f}",
                        interval(p["answered"]["difference"], p["answered"]["ci95"],
                                 lambda x: signed(x, 3)),
                        f"{p['tokens']['first']:.1f} / {p['tokens']['second']:.1f}",
                        interval(p["tokens"]["difference"], p["tokens"]["ci95"],
                                 lambda x: signed(x, 1))] for p in metrics["pairs"]],
                      align="llrllll")]
    out += [Heading(2, "Each method's statistics"),
            Bullets([f"{name} @ {b}: " + "; ".join(f"{k} {_stat(v)}" for k, v in r["stats"].items())
                     for name, runs in metrics["methods"].items()
                     for b, r in runs["budgets"].items() if r["stats"]]),
            Figure(figure, "Success against mean tokens per problem, each method: some output "
                   "correct (left) and the committed answer correct (right).")]
    return out


def write_report(metrics: dict, out: Path) -> str:
    """The figure, report.md and report.html in ``out``; returns the Markdown."""
    figure = success_figure(metrics["methods"], out / "figures" / "success_vs_tokens.png")
    return write_pages(out, report_blocks(metrics, figure))
