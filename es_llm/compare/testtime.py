"""Test-time curves in ``es-llm compare``: the same methods, budgets and seeds run on every
compared model folder (base, ES and GRPO checkpoints), success against tokens per problem
in one figure, and the areas under the curves side by side. It answers whether cheaper
search on the base model recovers what training bought."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from es_llm.errors import BadInput
from es_llm.testtime.methods import METHODS, TestTimeSettings


@dataclass(frozen=True)
class TestTimeCompare:
    __test__ = False  # not a pytest test class, despite its name

    # Test-time methods to run on every model folder (empty = off), e.g. [independent,
    # base_select]; a method's roles must be in every model (checkpoints of the student know
    # only solve: independent, base_select).
    methods: tuple[str, ...] = ()
    # Budget levels in each method's unit, as `es-llm testtime --budgets`.
    budgets: tuple[int, ...] = (2, 4, 8)


def testtime_config(cfg, model: Path, sources: list):
    """The ``TestTimeConfig`` of one compared model: the comparison's seed, temperature,
    longest completion and bootstrap, and one problem file for every model (the task's, else
    the first model's held-out set), so all curves are read on the same problems."""
    from dataclasses import replace

    from es_llm.testtime.run import TestTimeConfig

    t = cfg.testtime
    data = cfg.task.data or str(Path(sources[0][1]) / "data" / "countdown_eval.jsonl")
    return TestTimeConfig(model=str(model), task=replace(cfg.task, data=data),
                          methods=t.methods, budgets=t.budgets,
                          backend="hf", seed=cfg.sampling.seed, bootstrap=cfg.bootstrap,
                          testtime=TestTimeSettings(temperature=cfg.sampling.temperature,
                                                    max_tokens=cfg.sampling.max_tokens))


def check_testtime(cfg, sources: list, loaded: dict) -> None:
    """BadInput unless every compared model is a folder with the methods' roles."""
    from es_llm.testtime.roles import check_roles

    if loaded:
        raise BadInput(f"compare testtime.methods runs the models themselves; "
                       f"{', '.join(loaded)} {'is' if len(loaded) == 1 else 'are'} given as "
                       f"samples, not model folders.")
    for name, path, _ in sources:
        tcfg = testtime_config(cfg, path, sources)  # validates methods, budgets and the task
        if not Path(tcfg.task.data).is_file():
            raise BadInput(f"compare testtime.methods: no problem file {tcfg.task.data!r}; "
                           f"give the problems with --data FILE.")
        check_roles(path, {m: METHODS.get(m).roles for m in cfg.testtime.methods})


def run_testtime(cfg, sources: list, out: Path, progress: bool) -> dict:
    """Every model's test-time runs (under ``out/testtime/NAME``) and the joint curves."""
    from es_llm.testtime.run import curves, testtime

    models = {}
    for name, path, _ in sources:
        metrics = testtime(testtime_config(cfg, path, sources), out / "testtime" / name,
                           progress=progress, echo=lambda *_: None)
        models[name] = metrics["methods"]
    joint = {f"{name} {m}": runs for name, methods in models.items() for m, runs in methods.items()}
    return {"models": models, "curves": curves(joint),
            "config": {"methods": list(cfg.testtime.methods),
                       "budgets": list(cfg.testtime.budgets)}}


def testtime_figure(section: dict, path: Path) -> str:
    from es_llm.testtime.report import success_figure

    joint = {f"{name} {m}": runs for name, methods in section["models"].items()
             for m, runs in methods.items()}
    success_figure(joint, path, "test-time methods by model")
    return path.name


def testtime_blocks(section: dict | None, figure: str | None) -> list[tuple]:
    """The report's test-time section: areas under success-vs-tokens and dominance."""
    if not section:
        return []
    c = section["config"]
    out: list[tuple] = [("h", 2, "Test-time methods"), ("p", (
        f"Every model runs {', '.join(c['methods'])} at budgets "
        f"{', '.join(map(str, c['budgets']))} on the compared problems (`es-llm testtime`, "
        f"folders under testtime/). Area: the mean success over a log10 range of tokens per "
        f"problem common to all curves; covered = some output correct, answered = the "
        f"committed answer correct."))]
    rows = [[label, f"{section['curves']['covered']['auc_log_tokens'][label]:.3f}",
             f"{section['curves']['answered']['auc_log_tokens'][label]:.3f}"]
            for label in section["curves"]["covered"]["auc_log_tokens"]]
    out.append(("table", ["model and method", "area (covered)", "area (answered)"], rows))
    dom = section["curves"]["covered"]["dominates"]
    out.append(("p", "Dominance on covered: " + ("; ".join(f"{a} over {b}" for a, b in dom)
                                                 if dom else "none.")))
    if figure:
        out.append(("img", figure, "Success against mean tokens per problem, every model "
                                   "and method."))
    return out
