"""Test-time curves in ``es-llm compare``: the same methods, budgets and seeds run on every
compared model folder (base, ES and GRPO checkpoints), success against tokens per problem
in one figure, and the areas under the curves side by side. It answers whether cheaper
search on the base model recovers what training bought."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from es_llm.compare.config import CompareConfig
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, Source,
                                    fields_dict)
from es_llm.errors import BadInput
from es_llm.report import Figure, Heading, Paragraph, Table, fixed
from es_llm.testtime.methods import METHODS, TestTimeSettings


def testtime_config(cfg: CompareConfig, model: Path, sources: tuple[Source, ...]):
    """The ``TestTimeConfig`` of one compared model: the comparison's seed, temperature,
    longest completion and bootstrap, and one problem file for every model (the task's, else
    the first model's held-out set), so all curves are read on the same problems."""
    from es_llm.testtime.run import TestTimeConfig

    t = cfg.testtime
    data = cfg.task.data or str(Path(sources[0].path) / "data" / "countdown_eval.jsonl")
    return TestTimeConfig(model=str(model), task=replace(cfg.task, data=data),
                          methods=t.methods, budgets=t.budgets,
                          backend="hf", runtime=cfg.runtime, seed=cfg.sampling.seed,
                          bootstrap=cfg.bootstrap,
                          testtime=TestTimeSettings(temperature=cfg.sampling.temperature,
                                                    max_tokens=cfg.sampling.max_tokens))


def check(inp: CheckInput) -> None:
    """BadInput unless every compared model is a folder with the methods' roles."""
    from es_llm.testtime.roles import check_roles

    if inp.loaded:
        raise BadInput(f"compare testtime.methods runs the models themselves; "
                       f"{', '.join(inp.loaded)} {'is' if len(inp.loaded) == 1 else 'are'} "
                       f"given as samples, not model folders.")
    for src in inp.sources:
        tcfg = testtime_config(inp.cfg, src.path, inp.sources)  # validates methods and budgets
        if not Path(tcfg.task.data).is_file():
            raise BadInput(f"compare testtime.methods: no problem file {tcfg.task.data!r}; "
                           f"give the problems with --data FILE.")
        check_roles(src.path, {m: METHODS.get(m).roles for m in inp.cfg.testtime.methods})


def _joint(models: dict) -> dict:
    """Every model's methods as one set of curves, labelled "MODEL METHOD"."""
    return {f"{name} {m}": runs for name, methods in models.items() for m, runs in methods.items()}


@dataclass(frozen=True)
class TestTime:
    """comparison.json["testtime"]: every model's test-time runs (``es-llm testtime``'s
    summaries), the joint curves and the settings."""

    __test__ = False  # not a pytest test class, despite its name

    models: dict[str, dict]
    curves: dict
    config: dict

    def to_json(self) -> dict:
        return {"testtime": fields_dict(self)}


def compute(inp: SectionInput) -> TestTime:
    """Every model's test-time runs (under ``out/testtime/NAME``) and the joint curves."""
    from es_llm.testtime.run import curves, testtime

    cfg = inp.cfg
    inp.echo(f"[compare] test-time methods {', '.join(cfg.testtime.methods)}")
    models = {}
    for src in inp.sources:
        metrics = testtime(testtime_config(cfg, src.path, inp.sources),
                           inp.out / "testtime" / src.name, progress=inp.progress,
                           echo=lambda *_: None)
        models[src.name] = metrics["methods"]
    return TestTime(models, curves(_joint(models)),
                    {"methods": list(cfg.testtime.methods), "budgets": list(cfg.testtime.budgets)})


def figures(comp: dict, folder: Path) -> dict[str, str]:
    from es_llm.testtime.report import success_figure

    path = folder / "testtime.png"
    return {"testtime": success_figure(_joint(comp["testtime"]["models"]), path,
                                       "test-time methods by model")}


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """The report's test-time section: areas under success-vs-tokens and dominance."""
    section = comp["testtime"]
    c = section["config"]
    areas = section["curves"]
    out: list = [Heading(2, "Test-time methods"), Paragraph(
        f"Every model runs {', '.join(c['methods'])} at budgets "
        f"{', '.join(map(str, c['budgets']))} on the compared problems (`es-llm testtime`, "
        f"folders under testtime/). Area: the mean success over a log10 range of tokens per "
        f"problem common to all curves; covered = some output correct, answered = the "
        f"committed answer correct.")]
    rows = [[label, fixed(areas["covered"]["auc_log_tokens"][label], 3),
             fixed(areas["answered"]["auc_log_tokens"][label], 3)]
            for label in areas["covered"]["auc_log_tokens"]]
    out.append(Table(["model and method", "area (covered)", "area (answered)"], rows))
    dom = areas["covered"]["dominates"]
    out.append(Paragraph("Dominance on covered: " + ("; ".join(f"{a} over {b}" for a, b in dom)
                                                     if dom else "none.")))
    out.append(Figure(figures["testtime"], "Success against mean tokens per problem, every "
                      "model and method."))
    return out


SECTIONS.register("testtime")(Section(
    place=50, enabled=lambda cfg: bool(cfg.testtime.methods), check=check, compute=compute,
    figures=figures, blocks=blocks))
