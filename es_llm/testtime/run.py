"""``es-llm testtime``: run test-time methods on one model and price them in tokens.

Everything is checked before anything runs (methods, the roles they need, budgets, the
task, the model folder, the output folder); the results are written at the end, each file
atomically: ``samples.jsonl`` (every generation with its token count, stage and verdict),
``outcomes.jsonl`` (one line per method, budget and problem with its cost), ``metrics.json``
and ``report.md`` with ``figures/success_vs_tokens.png``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from es_llm.backends import BACKEND_NAMES, BackendSpec, make_backend
from es_llm.config import check_choices, choice, run_config_yaml
from es_llm.errors import BadInput
from es_llm.io import write_json_atomic, write_jsonl_atomic, write_text_atomic
from es_llm.metrics.passk import bootstrap_ci
from es_llm.models import check_model_path
from es_llm.run_folder import check_out_path
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig, build_task
# Importing these modules registers their methods.
from es_llm.testtime import dart, protocols, selection, ttel  # noqa: F401
from es_llm.testtime.curves import auc_difference_ci, dominates, log_auc, pareto_front
from es_llm.testtime.generations import Generations, HFScorer
from es_llm.testtime.methods import FORMATS, METHODS, MethodInput, TestTimeSettings
from es_llm.testtime.roles import check_roles


@dataclass(frozen=True)
class TestTimeConfig:
    __test__ = False  # not a pytest test class, despite its name

    # The model folder (the reasoning testbed model for the multi-role methods).
    model: str = ""
    # The problems: countdown, or knowledge (its model: es-llm testbed knowledge.enabled=true)
    # for independent, direct and cpp; without data, the model's held-out
    # data/<task>_eval.jsonl.
    task: TaskConfig = field(default_factory=lambda: TaskConfig(name="countdown"))
    # Methods to run, from: independent, direct, cpp, dart, ttel, base_select, formalize_all,
    # base_oracle, per, broadcast, discussion.
    methods: tuple[str, ...] = ("independent", "direct", "cpp", "dart", "ttel", "base_select",
                                "formalize_all", "base_oracle", "per", "broadcast",
                                "discussion")
    # Budget levels, each method's own unit (samples, branches, candidates, peers).
    budgets: tuple[int, ...] = (2, 4, 8)
    # Methods compared pairwise at every budget, as A:B (A minus B in answered and in tokens
    # per problem, on the same problems, paired 95% intervals); a pair is left out when
    # either method does not run.
    pairs: tuple[str, ...] = ("base_select:formalize_all", "base_select:base_oracle")
    # Generation backend: hf (the default: the model also scores tokens for ttel), auto
    # (vLLM when installed) or vllm.
    backend: str = choice("hf", lambda: BACKEND_NAMES)
    # Device, dtype, context length and engine memory of the model.
    runtime: Runtime = field(default_factory=Runtime)
    # Seed of the sampler, of the methods' own random choices and of the bootstrap.
    seed: int = 0
    # Bootstrap resamples over problems for the 95% intervals.
    bootstrap: int = 1000
    testtime: TestTimeSettings = field(default_factory=TestTimeSettings)

    def __post_init__(self):
        check_choices(self)
        for name in self.methods:
            if name not in METHODS:
                raise BadInput(f"unknown test-time method {name!r}; valid methods are: "
                               f"{', '.join(METHODS.names())}.")
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise BadInput(f"methods must be a non-empty list without repeats, got "
                           f"{list(self.methods)}.")
        if not self.budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                   for b in self.budgets):
            raise BadInput(f"budgets must be positive integers (samples, branches, candidates "
                           f"or peers per problem), got {list(self.budgets)}.")
        for name in self.methods:
            low = METHODS.get(name).min_budget
            if min(self.budgets) < low:
                raise BadInput(f"{name} needs budgets of at least {low} (K < {low} "
                               f"{METHODS.get(name).unit} leaves nothing to select from), got "
                               f"{list(self.budgets)}; e.g. --budgets 2,4,8.")
        bad = [p for p in self.pairs if p.count(":") != 1 or p.split(":")[0] == p.split(":")[1]
               or any(m not in METHODS for m in p.split(":"))]
        if bad:
            raise BadInput(f"pairs entries must be A:B, two different test-time methods "
                           f"({', '.join(METHODS.names())}), got {bad}.")
        if self.task.name not in FORMATS:
            raise BadInput(f"testtime runs on the tasks {', '.join(FORMATS.names())} only (it "
                           f"writes their role prompts), got {self.task.name!r}.")
        other = [m for m in self.methods if self.task.name not in METHODS.get(m).tasks]
        if other:
            runnable = [m for m in METHODS.names() if self.task.name in METHODS.get(m).tasks]
            raise BadInput(f"on task {self.task.name} the methods {', '.join(other)} cannot "
                           f"run (they read Countdown traces, reviews or statements); choose "
                           f"from {', '.join(runnable)}, e.g. --methods {','.join(runnable)}.")
        if self.bootstrap < 10:
            raise BadInput(f"bootstrap must be at least 10 resamples, got {self.bootstrap}.")
        if self.task.chat.template:
            raise BadInput("testtime writes its own role prompts (the testbed's formats) and "
                           "sends them raw, so task.chat.template must be off.")


def _problems(cfg: TestTimeConfig):
    """The evaluation problems and, if DART runs, its calibration problems."""
    task_cfg = cfg.task
    if task_cfg.data is None:
        held = Path(cfg.model) / "data" / f"{task_cfg.name}_eval.jsonl"
        if not held.is_file():
            raise BadInput(f"model {cfg.model!r} has no held-out data/{held.name}; give the "
                           f"problems with --data FILE.")
        task_cfg = replace(task_cfg, data=str(held))
    task = build_task(task_cfg)
    problems = task.problems()
    calibration = []
    if "dart" in cfg.methods:
        path = cfg.testtime.calibration_data or str(Path(cfg.model) / "data" /
                                                    "countdown_rl.jsonl")
        if not Path(path).is_file():
            raise BadInput(f"dart calibrates on problems apart from the evaluated ones: "
                           f"{path!r} does not exist; set testtime.calibration_data=FILE.")
        cal = build_task(TaskConfig(name="countdown", data=path))
        every = cal.problems()
        cal.close()
        if not every:
            raise BadInput(f"dart's calibration set is empty: {path!r} holds no problems, so "
                           f"there is nothing to fit the thinking budget on. Give "
                           f"testtime.calibration_data a file of Countdown problems apart "
                           f"from the evaluated ones, or leave dart out of --methods.")
        # Evenly spaced through the file: held-out files are ordered by tier.
        step = max(1, len(every) // cfg.testtime.calibration_problems)
        calibration = every[::step][:cfg.testtime.calibration_problems]
        if {p.id for p in calibration} & {p.id for p in problems}:
            raise BadInput("dart's calibration problems overlap the evaluated problems; give "
                           "testtime.calibration_data a file of other problems.")
    if not problems:
        raise BadInput(f"no problems in {task_cfg.data!r}.")
    return task, problems, calibration


def _rate(values: list[bool], rng, resamples: int) -> dict:
    v = np.asarray(values, dtype=float)
    lo, hi = bootstrap_ci(v, rng, num_resamples=resamples)
    return {"value": float(v.mean()), "ci95": [lo, hi]}


def run_methods(cfg: TestTimeConfig, gen: Generations, problems, calibration,
                progress: bool = True) -> tuple[dict, list[dict]]:
    """Every method at every budget; the per-budget summaries and the outcome rows."""
    rng = np.random.default_rng(cfg.seed)
    summary, outcome_rows = {}, []
    jobs = [(m, b) for m in cfg.methods for b in cfg.budgets]
    bar = tqdm(total=len(jobs), desc="testtime", unit="run", disable=not progress)
    for name in cfg.methods:
        spec = METHODS.get(name)
        t0 = time.perf_counter()
        prepared = spec.prepare(gen, cfg.testtime, calibration) if spec.prepare else None
        runs = {"unit": spec.unit, "prepare_s": round(time.perf_counter() - t0, 2),
                "budgets": {}}
        for budget in cfg.budgets:
            t0 = time.perf_counter()
            label = (name, budget)
            result = spec.run(MethodInput(label, problems, budget, gen, cfg.testtime,
                                          prepared, FORMATS.get(cfg.task.name)))
            for row in result.outcomes:
                generated, scored = gen.cost(label, row["problem_id"])
                outcome_rows.append({"method": name, "budget": budget, **row,
                                     "generated_tokens": generated, "scored_tokens": scored,
                                     "tokens": generated + scored})
            mine = outcome_rows[-len(result.outcomes):]
            runs["budgets"][str(budget)] = {
                "problems": len(mine),
                "tokens_mean": float(np.mean([r["tokens"] for r in mine])),
                "generated_tokens_mean": float(np.mean([r["generated_tokens"] for r in mine])),
                "scored_tokens_mean": float(np.mean([r["scored_tokens"] for r in mine])),
                "covered": _rate([r["covered"] for r in mine], rng, cfg.bootstrap),
                "answered": _rate([r["answered"] for r in mine], rng, cfg.bootstrap),
                "seconds": round(time.perf_counter() - t0, 2),
                "stats": result.stats}
            bar.update(1)
        summary[name] = runs
    bar.close()
    return summary, outcome_rows


def paired(cfg: TestTimeConfig, outcome_rows: list[dict], rng: np.random.Generator
           ) -> list[dict]:
    """Each pair of ``cfg.pairs`` whose methods both ran, at every budget: A minus B in
    answered and in tokens per problem, with paired 95% intervals over problems (the mean of
    per-problem differences, the problems resampled)."""
    out = []
    for pair in cfg.pairs:
        first, second = pair.split(":")
        if first not in cfg.methods or second not in cfg.methods:
            continue
        for budget in cfg.budgets:
            rows = {m: [r for r in outcome_rows if r["method"] == m and r["budget"] == budget]
                    for m in (first, second)}
            assert [r["problem_id"] for r in rows[first]] == \
                [r["problem_id"] for r in rows[second]]
            entry = {"first": first, "second": second, "budget": budget}
            for key in ("answered", "tokens"):
                a, b = (np.array([r[key] for r in rows[m]], dtype=float) for m in (first, second))
                lo, hi = bootstrap_ci(a - b, rng, num_resamples=cfg.bootstrap)
                entry[key] = {"first": float(a.mean()), "second": float(b.mean()),
                              "difference": float((a - b).mean()), "ci95": [lo, hi]}
            out.append(entry)
    return out


def curves(summary: dict, outcome_rows: list[dict] | None = None, reference: str | None = None,
           rng: np.random.Generator | None = None, resamples: int = 1000) -> dict:
    """Frontier, area on a log-token axis and dominance, for both success measures; with
    the outcome rows, each method's area minus the ``reference`` method's with a paired
    bootstrap interval over problems."""
    out = {}
    for measure in ("covered", "answered"):
        pts = {m: (np.array([r["tokens_mean"] for r in s["budgets"].values()]),
                   np.array([r[measure]["value"] for r in s["budgets"].values()]))
               for m, s in summary.items()}
        every = np.concatenate([t for t, _ in pts.values()])
        low, high = float(every[every > 0].min()), float(every.max())
        front = pareto_front([(f"{m}@{b}", r["tokens_mean"], r[measure]["value"])
                              for m, s in summary.items() for b, r in s["budgets"].items()])
        if high <= low:
            high = low * 1.0001
        out[measure] = {
            "range": [low, high],
            "frontier": [{"point": lbl, "tokens": t, "success": s} for lbl, t, s in front],
            "auc_log_tokens": {m: log_auc(*p, low, high) for m, p in pts.items()},
            "dominates": [[a, b] for a in pts for b in pts
                          if a != b and dominates(pts[a], pts[b], low, high)]}
        if outcome_rows and reference in summary:
            tokens, success = _per_problem(summary, outcome_rows, measure)
            out[measure]["auc_minus_" + reference] = {
                m: auc_difference_ci(tokens, success, m, reference, low, high, rng, resamples)
                for m in summary if m != reference}
    return out


def _per_problem(summary: dict, outcome_rows: list[dict], measure: str):
    """Per method, one [P] array per budget of tokens and of success, problems in order."""
    tokens, success = {}, {}
    for m, s in summary.items():
        tokens[m], success[m] = [], []
        for b in s["budgets"]:
            mine = [r for r in outcome_rows if r["method"] == m and str(r["budget"]) == b]
            tokens[m].append(np.array([r["tokens"] for r in mine], dtype=float))
            success[m].append(np.array([r[measure] for r in mine], dtype=float))
    return tokens, success


def testtime(cfg: TestTimeConfig, out: str | Path, progress: bool = True, echo=print,
             on_folder=None) -> dict:
    """The whole of ``es-llm testtime``."""
    from es_llm.testtime.report import write_report

    out = check_out_path(out)
    check_model_path(cfg.model)
    check_roles(cfg.model, {m: METHODS.get(m).roles for m in cfg.methods})
    task, problems, calibration = _problems(cfg)
    t_start = time.perf_counter()
    backend = make_backend(BackendSpec(cfg.model, backend=cfg.backend, runtime=cfg.runtime,
                                       seed=cfg.seed))
    scorer = None
    if any(METHODS.get(m).needs_scorer for m in cfg.methods):
        if backend.name == "hf":
            scorer = HFScorer(cfg.model, model=backend.model, tokenizer=backend.tokenizer)
        else:
            from transformers import AutoModelForCausalLM

            scorer = HFScorer(cfg.model, model=AutoModelForCausalLM.from_pretrained(
                cfg.model, **cfg.runtime.load_kwargs()).to(cfg.runtime.device))
    echo(f"test-time methods {', '.join(cfg.methods)} at budgets "
         f"{', '.join(map(str, cfg.budgets))} on {len(problems)} problems, backend "
         f"{backend.name}")
    try:
        gen = Generations(backend, task, cfg.testtime.temperature, cfg.seed, scorer,
                          value=FORMATS.get(cfg.task.name).value)
        summary, outcome_rows = run_methods(cfg, gen, problems, calibration, progress)
    finally:
        backend.close()
        task.close()
    reference = "independent" if "independent" in cfg.methods else None
    metrics = {"methods": summary,
               "curves": curves(summary, outcome_rows, reference,
                                np.random.default_rng(cfg.seed), cfg.bootstrap),
               "pairs": paired(cfg, outcome_rows, np.random.default_rng(cfg.seed)),
               "config": {"model": cfg.model, "task": cfg.task.name, "problems": len(problems),
                          "backend": backend.name},
               "perf": {"wall_s": round(time.perf_counter() - t_start, 1),
                        "generated_tokens": sum(r["num_tokens"] for r in gen.rows),
                        "generations": len(gen.rows)}}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
    write_jsonl_atomic(out / "samples.jsonl", gen.rows)
    write_jsonl_atomic(out / "outcomes.jsonl", outcome_rows)
    write_json_atomic(out / "metrics.json", metrics)
    text = write_report(metrics, out)
    if on_folder is not None:
        on_folder(out)
    # The terminal gets the main table; the frontier, areas and statistics are in the report.
    echo(text.split("\n## ", 1)[0].rstrip())
    echo(f"wrote {out / 'report.md'}, {out / 'metrics.json'} and {out / 'samples.jsonl'}")
    return metrics
