"""The sections of ``es-llm compare`` through their registry: the declared order and each
section's enablement, checks, computes and blocks, and a toy section registered here that
takes its declared place in the check, the numbers, the figures and the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from es_llm.compare.config import (BlindSpotConfig, BudgetConfig, CompareConfig,
                                   ConnectivityConfig, ConversionArm, DriftConfig,
                                   GeometryConfig, TestTimeCompare)
from es_llm.compare.difficulty import difficulty
from es_llm.compare.run import compare, compute_all
from es_llm.compare.samples import load_samples
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, Source,
                                    always, sections)
from es_llm.errors import BadInput
from es_llm.report import Figure, Heading, Paragraph, Table, pyplot, save_figure
from es_llm.tasks import TaskConfig
from test_compare_analysis import write_samples

ALWAYS = ["summary", "difficulty", "training_samples", "passk", "coverage", "diversity",
          "training", "models"]


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """Sample folders of base, es@0 and es@1 on 12 problems, 4 samples each; es@0 comes from
    a training run whose metrics.jsonl ends at 256 generated samples."""
    root = tmp_path_factory.mktemp("sections")
    rng = np.random.default_rng(1)
    folders = {name: write_samples(root / name, rng.random((12, 4)) < p)
               for name, p in (("base", 0.3), ("es@0", 0.5), ("es@1", 0.45))}
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"es/reward_mean": r, "samples/generated": s}) + "\n"
        for r, s in ((0.1, 128), (0.3, 256))))
    return folders, run


def _sets(evals):
    folders, run = evals
    return tuple(load_samples(name, path, run=str(run) if name == "es@0" else None)
                 for name, path in folders.items())


def test_sections_take_their_declared_places_and_each_setting_adds_its_own():
    assert [name for name, _ in sections(CompareConfig())] == ALWAYS
    for setting, name, place in (
            ({"temperatures": (0.6,)}, "capability", 1),
            ({"also_on": ("never_seen.jsonl",)}, "capability", 1),
            ({"blind_spot": BlindSpotConfig(enabled=True)}, "blind_spot", 2),
            ({"testtime": TestTimeCompare(methods=("independent",))}, "testtime", 2),
            ({"budget": BudgetConfig(runs=("es@0=run",))}, "budget_study", 3),
            ({"geometry": GeometryConfig(enabled=True)}, "geometry", 8),
            ({"connectivity": ConnectivityConfig(enabled=True)}, "connectivity", 8),
            ({"drift": DriftConfig(enabled=True)}, "drift", 8),
            ({"conversion": {"w8": ConversionArm(converted="a", rl="b")}}, "conversion", 8)):
        found = [n for n, _ in sections(CompareConfig(**setting))]
        assert found == ALWAYS[:place] + [name] + ALWAYS[place:], setting
    every = CompareConfig(temperatures=(0.6,), blind_spot=BlindSpotConfig(enabled=True),
                          testtime=TestTimeCompare(methods=("independent",)),
                          budget=BudgetConfig(runs=("es@0=run",)),
                          geometry=GeometryConfig(enabled=True),
                          connectivity=ConnectivityConfig(enabled=True),
                          drift=DriftConfig(enabled=True),
                          conversion={"w8": ConversionArm(converted="a", rl="b")})
    assert [n for n, _ in sections(every)] == [
        "summary", "capability", "difficulty", "blind_spot", "testtime", "training_samples",
        "budget_study", "passk", "coverage", "diversity", "training", "models", "geometry",
        "connectivity", "drift", "conversion"]


def test_two_sections_in_one_place_are_refused():
    clash = Section(place=30, enabled=always, blocks=lambda comp, figures: [])
    with SECTIONS.registered("clash", clash):
        with pytest.raises(ValueError, match=r"share place\(s\) \[30\]"):
            sections(CompareConfig())


def test_each_check_refuses_its_bad_input_before_anything_runs(evals, tmp_path):
    folders, _ = evals
    loaded = {s.name: s for s in _sets(evals)}
    sources = tuple(Source(name, path, None) for name, path in folders.items())

    def check(name, message, **settings):
        inp = CheckInput(CompareConfig(**settings), sources, loaded)
        with pytest.raises(BadInput, match=message):
            SECTIONS.get(name).check(inp)

    check("capability", "must be a model folder", temperatures=(0.6,))
    check("testtime", "given as samples, not model folders",
          testtime=TestTimeCompare(methods=("independent",)))
    check("budget_study", "--reference must name one model folder",
          budget=BudgetConfig(runs=("es@0=run",)))
    check("blind_spot", "needs task countdown", blind_spot=BlindSpotConfig(enabled=True),
          task=TaskConfig(name="arithmetic"))
    check("blind_spot", r"at least blind_spot.k=6 samples .* base has n=4",
          blind_spot=BlindSpotConfig(enabled=True))
    check("difficulty", "is not a file", difficulty_file=str(tmp_path / "none.jsonl"))
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps({"id": f"p{i}", "difficulty": i}) + "\n"
                             for i in range(11)))
    check("difficulty", "no 'difficulty' for 1 of the compared problems",
          difficulty_file=str(short))
    # What a check found is what its compute gets: the parsed difficulty column.
    full = tmp_path / "full.jsonl"
    full.write_text("".join(json.dumps({"id": f"p{i}", "human": i / 10}) + "\n"
                            for i in range(12)))
    cfg = CompareConfig(difficulty_file=str(full), difficulty_column="human")
    assert SECTIONS.get("difficulty").check(CheckInput(cfg, sources, loaded)) == {
        "name": "human", "values": {f"p{i}": i / 10 for i in range(12)}}
    assert SECTIONS.get("difficulty").check(CheckInput(CompareConfig(), sources, loaded)) is None


def test_computes_write_disjoint_parts_that_do_not_depend_on_each_other(evals, tmp_path):
    sets = _sets(evals)
    cfg = CompareConfig(models=("base=x",), bootstrap=50)
    inp = SectionInput(cfg, (), sets, tmp_path, False, lambda *_: None)
    comp = compute_all(inp, {})
    assert list(comp) == ["settings", "problem_ids", "models", "methods", "pairs", "difficulty",
                          "training_samples", "training", "machines"]
    # A section's numbers come from its own stream: computed alone, after no other section,
    # the difficulty part is the same.
    alone = SECTIONS.get("difficulty").compute(inp).to_json()["difficulty"]
    assert comp["difficulty"] == alone == difficulty(
        list(sets), "base", np.random.default_rng(0), 50)
    # The run behind es@0 spent 256 generated samples; es@1 has no known run.
    assert comp["training_samples"] == {"es": [256]}
    assert comp["training"] == {"es@0": {"metric": "es/reward_mean", "samples": [128, 256],
                                         "reward": [0.1, 0.3]}}
    assert comp["machines"] == {name: {"trained": None, "sampled": None}
                                for name in ("base", "es@0", "es@1")}


def test_blocks_by_hand():
    budget = SECTIONS.get("training_samples").blocks(
        {"training_samples": {"es": [256.0, 256.0, 512.0]}}, {})
    assert budget == [Heading(2, "Training budget"),
                      Table(["method", "generated samples per run", "runs"],
                            [["es", "256, 512", "3"]])]
    assert SECTIONS.get("training_samples").blocks({"training_samples": {}}, {}) == []
    comp = {"models": {"base": {"source": "b.jsonl", "run": None},
                       "es": {"source": "e.jsonl", "run": "runs/es"}},
            "machines": {"base": {"trained": "AMD EPYC", "sampled": None},
                         "es": {"trained": "Intel Xeon", "sampled": "Intel Xeon"}}}
    models = SECTIONS.get("models").blocks(comp, {})
    assert models[1].rows == [["base", "b.jsonl", "-", "AMD EPYC", "-"],
                              ["es", "e.jsonl", "runs/es", "Intel Xeon", "Intel Xeon"]]
    assert models[2].text.startswith("**Different machines.** These results come from AMD "
                                     "EPYC; Intel Xeon.")
    assert SECTIONS.get("training").blocks({"training": {}}, {}) == []


@dataclass(frozen=True)
class Toy:
    problems: int

    def to_json(self) -> dict:
        return {"toy": {"problems": self.problems}}


def test_a_toy_section_takes_its_declared_place_everywhere(evals, tmp_path):
    folders, _ = evals
    calls = []

    def check(inp: CheckInput):
        # Before anything is sampled or written.
        calls.append(("check", sorted(inp.loaded), (tmp_path / "cmp").exists()))
        return "checked"

    def compute(inp: SectionInput) -> Toy:
        calls.append(("compute", inp.checked))
        return Toy(len(inp.sets[0].problem_ids))

    def figures(comp: dict, folder: Path) -> dict[str, str]:
        fig, ax = pyplot().subplots()
        ax.bar(["toy"], [comp["toy"]["problems"]])
        return {"toy": save_figure(fig, folder / "toy.png")}

    toy = Section(place=35, enabled=lambda cfg: cfg.bootstrap >= 20, check=check,
                  compute=compute, figures=figures,
                  blocks=lambda comp, figs: [Heading(2, "Toy"),
                                             Paragraph(f"{comp['toy']['problems']} problems."),
                                             Figure(figs["toy"], "The toy figure.")])
    models = tuple(f"{name}={path}" for name, path in folders.items())
    with SECTIONS.registered("toy", toy):
        assert [n for n, _ in sections(CompareConfig(bootstrap=20))][1:4] == [
            "difficulty", "toy", "training_samples"]
        comp = compare(CompareConfig(models=models, bootstrap=20), tmp_path / "cmp",
                       progress=False, echo=lambda *_: None)
        assert calls == [("check", ["base", "es@0", "es@1"], False), ("compute", "checked")]
        assert comp["toy"] == {"problems": 12} and comp["figures"]["toy"] == "toy.png"
        saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
        assert list(saved).index("toy") == list(saved).index("difficulty") + 1
        md = (tmp_path / "cmp" / "report.md").read_text()
        assert md.index("## Gains by difficulty") < md.index("## Toy\n\n12 problems.") \
            < md.index("## pass@k")
        assert "![The toy figure.](figures/toy.png)" in md
        assert 'src="figures/toy.png"' in (tmp_path / "cmp" / "report.html").read_text()
        # Not enabled: not checked, computed, drawn or written.
        calls.clear()
        comp = compare(CompareConfig(models=models, bootstrap=10), tmp_path / "off",
                       progress=False, echo=lambda *_: None)
        assert calls == [] and "toy" not in comp and "toy" not in comp["figures"]
        assert "## Toy" not in (tmp_path / "off" / "report.md").read_text()
    assert "toy" not in SECTIONS


@dataclass(frozen=True)
class _Part:
    entries: dict

    def to_json(self) -> dict:
        return self.entries


def test_a_section_writing_another_sections_key_is_refused(evals, tmp_path):
    thief = Section(place=15, enabled=always, blocks=lambda comp, figures: [],
                    compute=lambda inp: _Part({"difficulty": {}}))
    cfg = CompareConfig(bootstrap=20)
    inp = SectionInput(cfg, (), _sets(evals), tmp_path, False, lambda *_: None)
    with SECTIONS.registered("thief", thief):
        with pytest.raises(ValueError, match=r"section difficulty writes comparison.json keys "
                                             r"\['difficulty'\]"):
            compute_all(inp, {})
