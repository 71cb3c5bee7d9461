"""`es-llm compare` end to end: report numbers against the metrics functions on the same
samples, the HTML page in a real browser, and bad input."""

from __future__ import annotations

import json
import re
import shutil
import struct

import numpy as np
import pytest

from es_llm.cli import main
from es_llm.evaluate import metrics_from_rows
from es_llm.io import read_jsonl
from browser import find_chromium, image_report
from test_compare_analysis import write_samples


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A comparison of three methods (two with two seeds) on 30 synthetic problems."""
    root = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    rates = rng.random(30)
    args = []
    for name, shift in (("base", 0.0), ("es@0", 0.05), ("es@1", 0.03), ("grpo@0", 0.2),
                        ("grpo@1", 0.15)):
        table = rng.random((30, 8)) < np.clip(rates + shift, 0, 1)[:, None]
        answers = [[("gold" if ok else f"w{rng.integers(0, 4)}") for ok in row] for row in table]
        args.append(f"{name}={write_samples(root / 'evals' / name, table, answers)}")
    out = root / "report"
    assert main(["compare", "--models", *args, "--out", str(out), "--no-progress"]) == 0
    return root, out


def test_report_numbers_are_the_metrics_of_the_same_samples(report):
    root, out = report
    comp = json.loads((out / "comparison.json").read_text())
    for name, model in comp["models"].items():
        rows = read_jsonl(root / "evals" / name / "samples.jsonl")
        ref = metrics_from_rows(rows, 8)
        for k in (1, 2, 4, 8):
            assert model["passk"][k - 1] == pytest.approx(ref[f"pass@{k}"]["value"], abs=1e-12)
        assert model["num_solved"] == ref["coverage"]["solved"]
        assert model["histogram"]["counts"] == ref["coverage"]["accuracy_histogram"]["counts"]
        for key in ("distinct_answers", "answer_entropy", "distinct_2", "self_bleu"):
            assert model["diversity"]["all"][key] == pytest.approx(ref["diversity"]["all"][key])
    es = comp["methods"]["es"]
    assert es["passk"]["mean"][0] == pytest.approx(
        np.mean([comp["models"][m]["passk"][0] for m in ("es@0", "es@1")]))
    lo, hi = es["passk"]["lo"][0], es["passk"]["hi"][0]
    assert lo < es["passk"]["mean"][0] < hi


def test_report_pages_hold_the_summary_and_every_figure(report):
    _, out = report
    comp = json.loads((out / "comparison.json").read_text())
    md = (out / "report.md").read_text()
    assert md.index("## Summary") < md.index("## pass@k") < md.index("## Coverage")
    assert "| es vs base | pass@1 |" in md and "| es vs grpo | pass@8 (= coverage) |" in md
    pair = next(p for p in comp["pairs"] if (p["a"], p["b"]) == ("grpo", "base"))
    assert f"+{100 * pair['pass@1']['diff']:.1f} [{100 * pair['pass@1']['ci95'][0]:.1f}" in md
    for name in comp["figures"].values():
        png = (out / "figures" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width > 600 and height > 300
        assert f"](figures/{name})" in md
        assert f'src="figures/{name}"' in (out / "report.html").read_text()


def test_html_report_shows_its_figures_in_a_headless_browser(report):
    # No skip without a browser: scripts/run_tests.sh installs chromium, and this test is
    # the only check that a reader actually sees the figures.
    assert find_chromium(), "chromium not found; scripts/run_tests.sh installs it"
    _, out = report
    page = image_report(out / "report.html")
    assert page["title"] == "es-llm comparison report"
    figures = json.loads((out / "comparison.json").read_text())["figures"]
    assert sorted(i["src"] for i in page["images"]) == sorted(f"figures/{f}" for f in figures.values())
    assert all(i["width"] > 600 and i["height"] > 300 for i in page["images"])


def test_difficulty_section_is_the_metrics_of_the_same_samples(report):
    from es_llm.metrics.difficulty import difficulty_bins, drg_auc

    root, out = report
    comp = json.loads((out / "comparison.json").read_text())
    diff = comp["difficulty"]
    assert diff["signals"] == ["base", "tier"] and diff["methods"]["base"]["drg"]["base"] is None

    def acc(name):
        rows = read_jsonl(root / "evals" / name / "samples.jsonl")
        by = {}
        for r in rows:
            by.setdefault(r["problem_id"], []).append(r["correct"])
        ids = sorted(by, key=lambda x: int(x[1:]))
        return np.array([np.mean(by[i]) for i in ids]), np.array([sum(by[i]) for i in ids])

    base_P, base_c = acc("base")
    es_P = (acc("es@0")[0] + acc("es@1")[0]) / 2
    e_P = 1.0 - base_c / 8  # the base model's failure rate, 8 samples per problem
    assert diff["methods"]["es"]["drg"]["base"]["auc"] == pytest.approx(drg_auc(e_P, es_P))
    bins = difficulty_bins(e_P)
    for k, cell in enumerate(diff["methods"]["es"]["by_bin"]):
        assert cell["problems"] == int((bins == k).sum())
        if cell["problems"]:
            assert cell["accuracy"] == pytest.approx(es_P[bins == k].mean())
            assert cell["difference"] == pytest.approx((es_P - base_P)[bins == k].mean())
    md = (out / "report.md").read_text()
    assert "## Gains by difficulty" in md and "(figures/difficulty.png)" in md
    d = diff["methods"]["grpo"]["drg"]["base"]
    assert f"| grpo | {d['value']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" in md
    tier0 = diff["methods"]["grpo"]["by_tier"][0]
    assert (f"| 0 | {tier0['problems']} | {100 * diff['methods']['base']['by_tier'][0]['accuracy']:.1f}%"
            in md)


def test_a_difficulty_file_adds_its_signal_and_bad_ones_exit_2(report, tmp_path, capsys):
    root, _ = report
    models = ["--models", f"base={root / 'evals' / 'base'}", f"es@0={root / 'evals' / 'es@0'}"]
    good = tmp_path / "human.jsonl"
    good.write_text("".join(json.dumps({"id": f"p{i}", "error_rate": i / 30}) + "\n"
                            for i in range(30)))
    out = tmp_path / "ok"
    assert main(["compare", *models, "--difficulty-file", str(good), "difficulty_column=error_rate",
                 "--out", str(out), "--no-progress"]) == 0
    diff = json.loads((out / "comparison.json").read_text())["difficulty"]
    assert diff["signals"] == ["base", "tier", "error_rate"]
    assert diff["methods"]["es"]["drg"]["error_rate"]["value"] == pytest.approx(
        diff["methods"]["es"]["drg"]["error_rate"]["auc"] * 2 - 1)
    capsys.readouterr()
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps({"id": f"p{i}", "error_rate": 0.5}) + "\n"
                             for i in range(29)))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "p0", "error_rate": 0.5}\nnot json\n')
    for path, message in ((short, "no 'error_rate' for 1 of the compared problems"),
                          (broken, "line 2 needs an 'id' and a finite number"),
                          (tmp_path / "none.jsonl", "is not a file")):
        bad = tmp_path / "bad"
        assert main(["compare", *models, "--difficulty-file", str(path),
                     "difficulty_column=error_rate", "--out", str(bad), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not bad.exists()


def test_samples_model_folders_with_identical_settings_and_reuses_them(ci_testbed, tmp_path, capsys):
    model = tmp_path / "copy"
    shutil.copytree(ci_testbed, model)
    args = ["compare", "--models", f"base={ci_testbed}", f"other={model}", "--task", "countdown",
            "--n", "2", "--limit", "6", "--backend", "hf", "--out", str(tmp_path / "r"),
            "--no-progress"]
    assert main(args) == 0
    a = read_jsonl(tmp_path / "r" / "samples" / "base" / "samples.jsonl")
    b = read_jsonl(tmp_path / "r" / "samples" / "other" / "samples.jsonl")
    # The same weights under the same sampling seed give the same samples.
    assert [r["completion"] for r in a] == [r["completion"] for r in b] and len(a) == 12
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("reusing") == 2


def test_bad_input_is_a_one_paragraph_error_with_status_2(report, tmp_path, capsys, ci_testbed):
    root, _ = report
    ragged = write_samples(tmp_path / "six", np.ones((30, 6), bool))
    cases = [
        (["--models", f"base={root / 'evals' / 'base'}", f"es={ragged}"], "n=6 samples per problem"),
        (["--models", f"base={root / 'evals' / 'base'}",
          f"es={write_samples(tmp_path / 'few', np.ones((3, 8), bool))}"], "different problem sets"),
        (["--models", f"base={root / 'evals' / 'base'}", f"es={tmp_path / 'nothing'}"],
         "is not a model folder"),
        (["--models", f"es={root / 'evals' / 'es@0'}"], "reference 'base' is none of the models"),
        (["--models", f"base={ci_testbed}", "--task", "go"], "not a registered task"),
    ]
    broken = tmp_path / "broken"
    shutil.copytree(ci_testbed, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    cases.append((["--models", f"base={root / 'evals' / 'base'}", f"es={broken}", "--task",
                   "countdown"], "model es folder .* does not load"))
    for extra, message in cases:
        out = tmp_path / "out"
        assert main(["compare", *extra, "--out", str(out), "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("es-llm compare: error:") and err.count("\n") == 1
        assert re.search(message, err), err
        assert not (out / "report.md").exists()


def test_capability_views_read_every_model_greedily_and_sampled_on_each_set(
        ci_testbed, tmp_path, capsys):
    model = tmp_path / "copy"
    shutil.copytree(ci_testbed, model)
    # A second problem file: the first 3 held-out problems of the testbed.
    rows = read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")[:3]
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r"
    args = ["compare", "--models", f"base={ci_testbed}", f"copy={model}", "--task", "countdown",
            "--n", "2", "--limit", "4", "--backend", "hf", "--temperatures", "0.6",
            "--also-on", str(extra), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    cap = json.loads((out / "comparison.json").read_text())["capability"]
    assert cap["temperatures"] == ["T=0.6", "T=1"]
    assert [(e["data"], e["num_problems"]) for e in cap["sets"]] == [("held-out", 4), ("extra", 3)]
    for entry in cap["sets"]:
        label = entry["data"]
        greedy = read_jsonl(out / "samples" / "views" / label / "greedy" / "base" / "samples.jsonl")
        assert len(greedy) == entry["num_problems"]
        base = entry["methods"]["base"]
        assert base["greedy"] == pytest.approx(np.mean([r["correct"] for r in greedy]))
        for t in ("T=0.6", "T=1"):
            assert base["gap"][t] == pytest.approx(base["greedy"] - base["sampled"][t]["pass@1"])
        # The same weights: the same greedy answers, nothing newly solved or lost.
        vs = entry["vs_reference"]["copy"]
        assert (vs["newly_solved"], vs["lost"], vs["greedy"]["diff"]) == (0, 0, 0)
    # The main comparison's samples are the task set's T = 1 view; no second draw of them.
    assert not (out / "samples" / "views" / "held-out" / "T1").exists()
    report = (out / "report.md").read_text()
    assert "## Capability or sharpening" in report and "gap T=0.6" in report
    assert (out / "figures" / "capability.png").stat().st_size > 0
    assert "(figures/capability.png)" in report
    # Gains by difficulty on the testbed's own tiers (the copy is the same model).
    diff = json.loads((out / "comparison.json").read_text())["difficulty"]
    assert "## Gains by difficulty" in report and "tier" in diff["signals"]
    copy_bins = diff["methods"]["copy"]["by_bin"]
    assert sum(b["problems"] for b in copy_bins) == 4
    d = diff["methods"]["copy"]["drg"]
    cells = ["-" if d[s] is None or d[s]["value"] != d[s]["value"] else
             f"{d[s]['value']:+.3f}" + (f" [{d[s]['ci95'][0]:+.3f}, {d[s]['ci95'][1]:+.3f}]"
                                       if d[s]["ci95"] else "") for s in diff["signals"]]
    assert "| copy | " + " | ".join(cells) + " |" in report
    # Sample files cannot be read again at other settings.
    capsys.readouterr()
    assert main(["compare", "--models", f"base={out / 'samples' / 'base'}", f"copy={model}",
                 "--n", "2", "--limit", "4", "--backend", "hf", "--temperatures", "0.6",
                 "--out", str(tmp_path / "r2"), "--no-progress"]) == 2
    assert "must be a model folder" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
