"""report.md and report.html from the comparison dict: one list of blocks rendered twice, so
the two pages always say the same thing. Every number comes from comparison.json."""

from __future__ import annotations

import html
from pathlib import Path

from es_llm.compare.budget import table as budget_table
from es_llm.compare.testtime import testtime_blocks
from es_llm.io import write_text_atomic

DIVERSITY_ROWS = (("distinct_answers", "distinct final answers"),
                  ("answer_entropy", "answer entropy (nats)"),
                  ("plurality_share", "plurality share"),
                  ("distinct_2", "distinct-2"), ("self_bleu", "self-BLEU"))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) >= 100 else f"{x:.{digits}f}"


def _count(x: float | None) -> str:
    """A count, or a mean of counts over seeds (one decimal then)."""
    return "-" if x is None else f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _interval(p: dict, fmt) -> str:
    lo, hi = p["ci95"]
    sign = "+" if p["diff"] >= 0 else ""
    return f"{sign}{fmt(p['diff'])} [{fmt(lo)}, {fmt(hi)}]"


def _points(x: float) -> str:
    return f"{100 * x:.1f}"


def _seed_range(method: dict, k_index: int) -> str:
    vals = [v[k_index] for v in method["passk"]["seed_values"].values()]
    return f" (seeds {_pct(min(vals))}..{_pct(max(vals))})" if len(vals) > 1 else ""


def _verdict(p: dict, a: str, b: str, word: str, seeds_overlap: bool | None = None) -> str:
    if p["ahead"] == "tie":
        return "no clear difference (CI includes 0)"
    who = a if p["ahead"] == "a" else b
    note = "; training seeds overlap" if seeds_overlap else ""
    return f"**{who}** {word}{note}"


def _overlap(ma: dict, mb: dict, k_index: int) -> bool:
    va = [v[k_index] for v in ma["passk"]["seed_values"].values()]
    vb = [v[k_index] for v in mb["passk"]["seed_values"].values()]
    return max(va) >= min(vb) and max(vb) >= min(va)


def summary_rows(comp: dict) -> list[list[str]]:
    """The plain-language table: per method pair and metric, the two values, the paired
    difference with its 95% CI, the seed ranges and who is ahead (only where the CI says so)."""
    n, methods, rows = comp["settings"]["n"], comp["methods"], []
    for p in comp["pairs"]:
        a, b = p["a"], p["b"]
        ma, mb = methods[a], methods[b]
        for key, label, k_index in (("pass@1", "pass@1", 0), (f"pass@{n}", f"pass@{n} (= coverage)", -1)):
            q = p[key]
            rows.append([f"{a} vs {b}", label, _pct(q["a"]) + _seed_range(ma, k_index),
                         _pct(q["b"]) + _seed_range(mb, k_index),
                         _interval(q, _points) + " pts",
                         _verdict(q, a, b, "ahead", _overlap(ma, mb, k_index))])
        for key, label, word in (("answer_entropy", "answer entropy (nats)", "more diverse"),
                                 ("distinct_correct", "distinct correct solutions", "more diverse")):
            q = p[key]
            rows.append([f"{a} vs {b}", label, _num(q["a"]), _num(q["b"]),
                         _interval(q, lambda x: f"{x:.3f}"), _verdict(q, a, b, word)])
    return rows


def in_words(comp: dict) -> list[str]:
    """One sentence per method pair, saying only what the intervals support."""
    n, lines = comp["settings"]["n"], []
    for p in comp["pairs"]:
        a, b = p["a"], p["b"]
        parts = []
        for key, label in (("pass@1", "pass@1"), (f"pass@{n}", f"pass@{n}")):
            q = p[key]
            ci = f"{_points(q['ci95'][0])}..{_points(q['ci95'][1])} pts"
            if q["ahead"] == "tie":
                parts.append(f"no clear difference on {label} ({a} - {b} = "
                             f"{'+' if q['diff'] >= 0 else ''}{_points(q['diff'])}, CI {ci})")
            else:
                who = a if q["ahead"] == "a" else b
                parts.append(f"{who} ahead on {label} by {_points(abs(q['diff']))} pts (CI of "
                             f"{a} - {b}: {ci})")
        q = p["answer_entropy"]
        parts.append("answer entropy not clearly different" if q["ahead"] == "tie" else
                     f"{a if q['ahead'] == 'a' else b} answers more diversely (answer entropy "
                     f"{a} {q['a']:.2f}, {b} {q['b']:.2f} nats)")
        if p["crossover_k"]:
            resolved = p["pass@1"]["ahead"] != "tie" or p[f"pass@{n}"]["ahead"] != "tie"
            parts.append(f"their mean pass@k curves cross at k = {p['crossover_k']}"
                         + ("" if resolved else ", a crossing within noise"))
        lines.append(f"**{a} vs {b}**: " + "; ".join(parts) + ".")
    return lines


def blocks(comp: dict, figures: dict[str, str]) -> list[tuple]:
    """The report as blocks: ("h", level, text), ("p", text), ("table", header, rows) and
    ("img", file, caption)."""
    s, methods, models = comp["settings"], comp["methods"], comp["models"]
    n = s["n"]
    out: list[tuple] = [("h", 1, "es-llm comparison report")]
    out.append(("p", f"{s['num_problems']} problems of task {s.get('task', '?')}, n = {n} samples "
                f"per problem at temperature {s.get('temperature', '?')} (seed "
                f"{s.get('seed', '?')}, at most {s.get('max_tokens', '?')} tokens), identical for "
                f"every model. Intervals are 95% paired bootstrap intervals over problems "
                f"({s['bootstrap_resamples']} resamples) of seed-averaged per-problem values; "
                f"the spread across training seeds is shown beside them. A side is called ahead "
                f"only where its interval excludes 0."))
    out.append(("h", 2, "Summary"))
    out.append(("table", ["comparison", "metric", "first", "second", "first - second [95% CI]",
                          "verdict"], summary_rows(comp)))
    out += [("p", line) for line in in_words(comp)]
    out += capability_blocks(comp.get("capability"), figures.get("capability"))
    out += difficulty_blocks(comp.get("difficulty"), figures.get("difficulty"))
    out += blind_spot_blocks(comp.get("blind_spot"), figures.get("blind_spot"))
    out += testtime_blocks(comp.get("testtime"), figures.get("testtime"))
    budget = comp.get("budget") or {}
    if budget:
        out.append(("h", 2, "Training budget"))
        out.append(("table", ["method", "generated samples per run", "runs"],
                    [[m, ", ".join(f"{int(v):,}" for v in sorted(set(vals))), str(len(vals))]
                     for m, vals in budget.items()]))
    out += budget_blocks(comp.get("budget_study"), figures.get("budget_study"))
    out += _passk_blocks(comp, figures)
    out += _coverage_blocks(comp, figures)
    out.append(("h", 2, "Diversity"))
    out.append(("img", figures["diversity"], "Diversity per method (seed means) and "
                "progressions / regressions against the base model."))
    header = ["metric"] + [f"{m} (all)" for m in methods] + [f"{m} (correct)" for m in methods]
    rows = [[label] + [_num(methods[m]["diversity"]["all"][key]) for m in methods]
            + [_num(methods[m]["diversity"]["correct"][key]) for m in methods]
            for key, label in DIVERSITY_ROWS]
    rows.append(["distinct correct solutions"]
                + [_num(methods[m]["diversity"]["distinct_correct_solutions"]) for m in methods]
                + ["" for _ in methods])
    out.append(("table", header, rows))
    if "training" in figures:
        out.append(("h", 2, "Training curves"))
        out.append(("img", figures["training"], "Training reward against generated samples. "
                    "ES scores its population greedily; the gradient methods' rollouts are "
                    "sampled, so the levels are not comparable, the trends are."))
    out.append(("h", 2, "Models"))
    where = comp.get("machines") or {}
    out.append(("table", ["model", "samples", "training run", "trained or built on",
                          "sampled on"],
                [[name, m["source"], m["run"] or "-",
                  (where.get(name) or {}).get("trained") or "-",
                  (where.get(name) or {}).get("sampled") or "-"]
                 for name, m in models.items()]))
    note = machines_note(where)
    if note:
        out.append(("p", note))
    return out


def capability_blocks(cap: dict | None, figure: str | None = None) -> list[tuple]:
    """Greedy beside sampled, per problem set: is a gain new problems solved, or sampling
    mass moved onto the answers the model already gave greedily?"""
    if not cap:
        return []
    out: list[tuple] = [("h", 2, "Capability or sharpening"), ("p", (
        "Every model read greedily (one sample at T = 0) and sampled at each temperature "
        "(pass@1 and pass@n of the same n samples). The sharpening gap is greedy accuracy "
        "minus sampled pass@1 at that temperature: training that only sharpens the "
        "distribution closes it without raising greedy accuracy, while new capability "
        "raises greedy accuracy and the problems newly solved greedily. Newly solved / lost "
        f"count the problems {cap['reference']} gets wrong / right greedily that the method "
        "gets right / wrong (seed means)."))]
    temps = cap["temperatures"]
    header = ["method", "greedy"]
    for t in temps:
        header += [f"pass@1 {t}", f"pass@n {t}", f"entropy {t}", f"gap {t}"]
    header += [f"greedy - {cap['reference']} [95% CI]", "newly solved / lost"]
    for entry in cap["sets"]:
        rows = []
        for method, m in entry["methods"].items():
            row = [method, _pct(m["greedy"])]
            for t in temps:
                sm = m["sampled"].get(t)
                gap = m["gap"].get(t)
                row += ["-"] * 4 if sm is None else [
                    _pct(sm["pass@1"]), _pct(sm["pass@n"]), _num(sm["entropy"]),
                    "-" if gap is None else f"{100 * gap:+.1f} pts"]
            vs = entry["vs_reference"].get(method)
            row += ["-", "-"] if vs is None else [
                _interval(vs["greedy"], _points) + " pts",
                f"{_count(vs['newly_solved'])} / {_count(vs['lost'])}"]
            rows.append(row)
        ns = sorted({sm["n"] for m in entry["methods"].values() for sm in m["sampled"].values()})
        out.append(("p", f"**{entry['data']}**: {entry['num_problems']} problems, n = "
                    f"{', '.join(map(str, ns))} samples per problem in the sampled views."))
        out.append(("table", header, rows))
    if figure:
        out.append(("img", figure, "Greedy accuracy beside sampled pass@1 at each temperature, "
                    "per problem set (seed means): a gain the greedy bar shares is new problems "
                    "solved, one only the sampled bars show is sharpening."))
    return out


def _drg_cell(d: dict | None) -> str:
    # Absent, or undefined (NaN in memory, null once written as JSON).
    if d is None or d["value"] is None or d["value"] != d["value"]:
        return "-"
    ci = d.get("ci95")
    return f"{d['value']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]"
                                   if ci and None not in ci else "")


def _group_table(diff: dict, key: str, first: str) -> tuple[list[str], list[list[str]]]:
    """Rows: bins (or tiers); columns: each method's accuracy, and for the others the
    paired difference to the reference with its interval."""
    ref = diff["reference"].split("@")[0]
    methods = diff["methods"]
    others = [m for m in methods if m != ref]
    header = [first, "problems"] + [f"{m} accuracy" for m in methods] + [
        f"{m} - {ref} [95% CI]" for m in others]
    rows = []
    for i, g in enumerate(methods[ref][key]):
        row = [g["label"], str(g["problems"])]
        row += [_pct(methods[m][key][i]["accuracy"]) for m in methods]
        for m in others:
            cell = methods[m][key][i]
            row.append("-" if cell["difference"] is None else _interval(
                {"diff": cell["difference"], "ci95": cell["ci95"]}, _points) + " pts")
        rows.append(row)
    return header, rows


def difficulty_blocks(diff: dict | None, figure: str | None) -> list[tuple]:
    """Where each method gains on a difficulty scale: DRG, accuracy per base-difficulty bin
    and per tier, against the reference."""
    if not diff:
        return []
    ref = diff["reference"]
    out: list[tuple] = [("h", 2, "Gains by difficulty"), ("p", (
        f"Base difficulty is {ref}'s failure rate on each problem (1 - c/n of its samples). "
        "DRG = 2 AUC - 1, where AUC is the chance that, of a failed and a solved sample, the "
        "failed one is on the harder problem (+1: a method fails only where the problems are "
        "hardest, 0: unrelated); it does not depend on accuracy. A gain in the base-hard "
        "bins is capability the reference lacked; a gain in the easy bins only is "
        "sharpening. Rarely solved: of the problems a method solves in any sample, the share "
        f"{ref} solved in under 5% of its samples."))]
    signals = diff["signals"]
    out.append(("table", ["method"] + [f"DRG vs {s} [95% CI]" for s in signals]
                + ["rarely solved"],
                [[m] + [_drg_cell(v["drg"][s]) for s in signals] + [_pct(v["rarely_solved_share"])]
                 for m, v in diff["methods"].items()]))
    out.append(("table", *_group_table(diff, "by_bin", "base difficulty")))
    if next(iter(diff["methods"].values()))["by_tier"] is not None:
        out.append(("table", *_group_table(diff, "by_tier", "tier")))
    if figure:
        out.append(("img", figure, "Accuracy per base-difficulty bin (seed means of per-problem "
                    "accuracy), per method; the bins run from problems the reference almost "
                    "always solves to those it (almost) never does."))
    return out


def _share(count: int, total: int) -> str:
    return f"{count} ({100 * count / total:.1f}%)" if total else "-"


def blind_spot_blocks(spot: dict | None, figure: str | None) -> list[tuple]:
    """The pass@k blind spot: never-sampled problems that grafted greedy chains solve."""
    if not spot:
        return []
    c = spot["config"]
    out: list[tuple] = [("h", 2, "The pass@k blind spot"), ("p", (
        f"For each model, the problems none of its first {c['k']} samples solves, read again "
        f"by six deterministic chains: greedy, and greedy with activations grafted into the "
        f"output of decoder layer {c['layer']} over the prompt (two with the problem's numbers "
        f"in another order, coefficient {c['reorder_coef']:g}; one with the mean activation "
        f"of {c['reference_prompts']} prompts, {c['mean_coef']:g}; two with another problem's "
        f"prompt, {c['mix_coef']:g}). Recovered: solved by any chain. Tokens: generated by the "
        f"chains against the {c['k']} samples of the same problems. A high recovery says the "
        f"solutions were within the weights' reach but not sampled."))]
    rows = []
    for name, m in spot["models"].items():
        d = m["diagnosed"]
        rows.append([name, str(m["never_solved"]), str(d), _share(m["greedy"], d),
                     _share(m["recovered"], d)]
                    + [_share(m["by_kind"][k], d) for k in ("reorder", "mean", "mix")]
                    + [f"{m['chain_tokens']:,} / {m['sample_tokens']:,}"])
    out.append(("table", ["model", "never solved", "read", "greedy alone", "recovered",
                          "reorder", "mean", "mix", "tokens: chains / samples"], rows))
    pairs = list(next(iter(spot["models"].values()))["jaccard"])
    out.append(("table", ["model"] + [f"Jaccard {p.replace('|', ' / ')}" for p in pairs],
                [[name] + [_num(m["jaccard"][p]) for p in pairs]
                 for name, m in spot["models"].items()]))
    if figure:
        out.append(("img", figure, "Share of each model's never-sampled problems solved by "
                    "greedy decoding alone and by any of the six chains."))
    return out


def budget_blocks(study: dict | None, figure: str | None) -> list[tuple]:
    """Accuracy against training budget: every checkpoint along the runs, by generated samples
    and by the training loop's own seconds."""
    if not study:
        return []
    reference = study["reference"]
    sampled = (f"; sampled {study['n']} times per problem at T = {study['temperature']:g} on "
               f"{study['num_sampled']:,} of them (every stride-th)" if study["n"] else "")
    out: list[tuple] = [("h", 2, "Accuracy against training budget"), ("p", (
        f"Every checkpoint saved along {len(study['runs'])} training runs and the reference "
        f"model, read greedily on the {study['num_problems']:,} problems of "
        f"{Path(study['data']).name}{sampled}. Samples are the generated training samples and "
        f"seconds the training loop's own (generation, scoring and update), summed to each "
        f"checkpoint and averaged over the seeds that have it, so runs on the same machine "
        f"compare; a budget in completions alone hides what each sample costs."))]
    header, rows = budget_table(study["rows"], study["base"], reference)
    out.append(("table", header, rows))
    if figure:
        out.append(("img", figure, "Accuracy against generated training samples (left) and "
                    "training seconds (right): each training seed thin, the seed mean bold "
                    "where every seed of the method has that checkpoint; the dotted line is "
                    f"{reference}."))
    return out


def machines_note(where: dict) -> str | None:
    """A warning when the compared models were trained or sampled on different kinds of
    machine, else None."""
    kinds = sorted({k for m in where.values() for k in m.values() if k})
    if len(kinds) < 2:
        return None
    return ("**Different machines.** These results come from " + "; ".join(kinds) + ". "
            "Builds and runs are bitwise reproducible only on one machine type: the same "
            "testbed config built on another CPU type gives other weights, so a difference "
            "between models made on different machines mixes the methods' effect with the "
            "machines'; it is reproducible only statistically.")


def _passk_blocks(comp: dict, figures: dict) -> list[tuple]:
    methods, n = comp["methods"], comp["settings"]["n"]
    ks = [k for k in methods[comp["settings"]["base"]]["passk"]["k"] if k & (k - 1) == 0 or k == n]
    rows = [[f"{k}"] + [f"{_pct(m['passk']['mean'][k - 1])} [{_pct(m['passk']['lo'][k - 1])}, "
                        f"{_pct(m['passk']['hi'][k - 1])}]" for m in methods.values()] for k in ks]
    cross = [f"{p['a']} vs {p['b']}: " + (f"the order at k = 1 flips at k = {p['crossover_k']}"
                                          if p["crossover_k"] else "no crossover up to k = n")
             for p in comp["pairs"]]
    return [("h", 2, "pass@k"),
            ("img", figures["passk"], f"pass@k for k = 1..{n} (seed means with 95% bootstrap "
             f"bands; dashed: single training seeds) and the difference to the base model."),
            ("table", ["k"] + list(methods), rows),
            ("p", "Crossover (seed-mean curves): " + "; ".join(cross) + ".")]


def _coverage_blocks(comp: dict, figures: dict) -> list[tuple]:
    methods, n = comp["methods"], comp["settings"]["n"]
    out = [("h", 2, "Coverage"),
           ("img", figures["coverage"], f"Problems solved at least once in n = {n} samples, "
            f"and the overlap of each pair of methods."),
           ("table", ["pair", "only first", "both", "only second", "neither"],
            [[f"{p['a']} vs {p['b']}"] + [_count(p["overlap"][k]) for k in (
                "num_only_a", "num_both", "num_only_b", "num_neither")] for p in comp["pairs"]])]
    trained = [m for m in methods if "vs_base" in methods[m]]
    if trained:
        out.append(("p", "Progressions are problems the base model never solves and the trained "
                    "model solves at least once; regressions the reverse. The answer entropy "
                    "on regressions is low when the trained model is confidently wrong there."))
        out.append(("table", ["method", "progressions", "share of the base's never-solved",
                              "regressions", "mean accuracy change",
                              "answer entropy on regressions", "plurality share on regressions"],
                    [[m, _count(methods[m]["vs_base"]["num_progressions"]),
                      _pct(methods[m]["vs_base"]["progression_share"]),
                      _count(methods[m]["vs_base"]["num_regressions"]),
                      _interval_free(methods[m]["vs_base"]["accuracy_delta"]),
                      _num(methods[m]["vs_base"]["regression_entropy"]),
                      _num(methods[m]["vs_base"]["regression_plurality"])] for m in trained]))
    out.append(("img", figures["histograms"], "Per-problem accuracy histogram (the first bin "
                "holds the problems never solved)."))
    return out


def _interval_free(x: float | None) -> str:
    return "-" if x is None else f"{'+' if x >= 0 else ''}{100 * x:.1f} pts"


def to_markdown(items: list[tuple]) -> str:
    lines: list[str] = []
    for item in items:
        if item[0] == "h":
            lines += ["#" * item[1] + " " + item[2], ""]
        elif item[0] == "p":
            lines += [item[1], ""]
        elif item[0] == "img":
            lines += [f"![{item[2]}](figures/{item[1]})", "", f"*{item[2]}*", ""]
        else:
            header, rows = item[1], item[2]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _inline(text: str) -> str:
    """HTML of a cell or paragraph: escaped, with **bold** kept."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f3f3f3}"
         "img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#555}")


def to_html(items: list[tuple]) -> str:
    body: list[str] = []
    for item in items:
        if item[0] == "h":
            body.append(f"<h{item[1]}>{html.escape(item[2])}</h{item[1]}>")
        elif item[0] == "p":
            body.append(f"<p>{_inline(item[1])}</p>")
        elif item[0] == "img":
            body.append(f'<figure><img src="figures/{html.escape(item[1])}" '
                        f'alt="{html.escape(item[2])}"><figcaption>{_inline(item[2])}'
                        f"</figcaption></figure>")
        else:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in item[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                           for row in item[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>es-llm comparison report"
            f"</title><style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def write_report(comp: dict, figures: dict[str, str], out: Path) -> None:
    items = blocks(comp, figures)
    write_text_atomic(out / "report.md", to_markdown(items))
    write_text_atomic(out / "report.html", to_html(items))
