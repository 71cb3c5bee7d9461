"""The configs of the studies that run `es-llm` commands as stages: the head-to-head
experiment (``ExperimentConfig``: its methods, the LatentRevise recovery before them, the
comparison; ``scripts/experiment.py``) and the pretraining-to-post-training study
(``ScalingConfig``: the grid of testbed builds, SFT, the fixed-budget trainers;
``scripts/scaling_study.py``). They are YAML sections like every other config, so their
files under configs/ load and are checked without running a study."""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.backends import BACKEND_NAMES
from es_llm.compare.config import BudgetConfig
from es_llm.config import check_choices, choice, parse_override
from es_llm.errors import BadInput
from es_llm.evaluate import SamplingConfig
from es_llm.runtime import Runtime
from es_llm.tasks import task_names
from es_llm.tasks.registry import parse_select
from es_llm.testbed.config import ModelShape
from es_llm.testbed.scaling import DOMAINS

# The trainers a method of the experiment may use.
KINDS = ("es", "grpo", "sft")
# The settings of `es-llm compare` the experiment gives itself, and the fields it gives
# them from; compare_overrides may set any other.
SET_BY_EXPERIMENT = {
    "models": "methods, seeds and references", "reference": "base model",
    "task": "task, eval_data, eval_select and eval_limit", "sampling": "sampling",
    "backend": "eval_backend", "runtime": "runtime", "temperatures": "temperatures",
    "also_on": "never_seen_per_tier", "views_n": "views_n", "budget": "budget",
    "conversion": "swarr"}


@dataclass(frozen=True)
class Method:
    # Which trainer: es (`es-llm es`, under mpirun with `ranks`), grpo (`es-llm grpo`) or sft
    # (`es-llm sft`: not budget-matched, its length is its config's epochs).
    kind: str = choice("es", lambda: KINDS)
    # Training config (a YAML under configs/) and overrides applied to every seed's run
    # ({out} stands for the experiment folder).
    config: str = ""
    overrides: tuple[str, ...] = ()
    # The starting model: a folder inside the base model's folder ("" = the base model
    # itself, e.g. swa for the sliding-window conversion that testbed_overrides
    # swa.enabled=true builds).
    model: str = ""
    # Accuracy against budget beyond the head-to-head: a copy of each finished run of these
    # seeds is continued to `extend` times budget_samples (runs/<name>-seed<k>-x<extend>,
    # a checkpoint at every multiple of the budget); 1 = no extension.
    extend: int = 1
    extend_seeds: tuple[int, ...] = (0,)

    def __post_init__(self):
        check_choices(self)
        if not self.config:
            raise BadInput("every method needs config: a training YAML under configs/ (e.g. "
                           "configs/es_countdown.yaml).")
        if self.extend < 1:
            raise BadInput(f"extend must be at least 1 (times budget_samples), got {self.extend}.")
        if self.kind == "sft" and self.extend > 1:
            raise BadInput("an sft method has no budget to extend; leave extend at 1.")


@dataclass(frozen=True)
class RecoverStage:
    # Run `es-llm latent-revise` on the base model before training (into OUT/recover), with
    # this config and overrides; methods read its files through {out}/recover/... .
    enabled: bool = False
    config: str = "configs/latent_revise_countdown.yaml"
    overrides: tuple[str, ...] = ()


def in_conversion(folder: str) -> bool:
    """A folder inside the testbed that is the sliding-window conversion (swa/) or in it."""
    return folder == "swa" or folder.startswith("swa/")


@dataclass(frozen=True)
class WindowStudy:
    # SWARR's window sweep: one sliding-window conversion of the testbed's student per
    # window (a testbed build with swa.enabled=true swa.window=W in OUT/windows/w<W>, W keys
    # per query, at most the model's context); every method and reference whose model is
    # the conversion (swa, or a folder inside it) runs once per window, named <name>_w<W>.
    # null = no sweep: the one conversion testbed_overrides configure.
    windows: tuple[int, ...] | None = None
    # The study's table in the comparison (its conversion section, pass@1 per tier against
    # the base): the reference that is the converted model after SFT, and for each method
    # trained under the window the method trained alike with full attention ("" = none);
    # with a sweep, one arm per window and method. converted "" = no table.
    converted: str = ""
    rl: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.windows is None:
            return
        if not self.windows:
            raise BadInput("swarr.windows is an empty sweep; give the windows to convert to, "
                           "e.g. swarr.windows=[16, 32, 64], or null for the one conversion "
                           "testbed_overrides configure.")
        bad = [w for w in self.windows if w < 1]
        repeated = sorted({w for w in self.windows if self.windows.count(w) > 1})
        if bad or repeated:
            raise BadInput(f"swarr.windows must be distinct positive numbers of tokens (keys "
                           f"per query), got {list(self.windows)}.")

    def arm_names(self, name: str) -> list[str]:
        """The names a method or reference living in the conversion gets: one per window."""
        return [name] if self.windows is None else [f"{name}_w{w}" for w in self.windows]


def _default_methods() -> dict[str, Method]:
    return {"es": Method("es", "configs/es_countdown.yaml"),
            "grpo": Method("grpo", "configs/grpo_countdown.yaml")}


@dataclass(frozen=True)
class ExperimentConfig:
    # The base model every method starts from: a model folder of your own, or "" to build
    # the testbed preset below (then the base is OUT/testbed).
    model: str = ""
    # Training problems of every method (its task.data); null = each method config's own.
    train_data: str | None = None
    # Problems the comparison reads every model on, and which of the file's rows (a slice
    # as task.select, e.g. -2000: for the last 2,000); null = the base model's held-out
    # data/<task>_eval.jsonl (a testbed build ships one; a model of your own needs this).
    eval_data: str | None = None
    eval_select: str | None = None
    # Device, dtype, context and engine memory of every training run and of the comparison,
    # set here once so all models are trained and read alike (values other than the defaults
    # override each method's config).
    runtime: Runtime = field(default_factory=Runtime)
    # Testbed preset (ci or default) and its overrides.
    testbed: str = "default"
    testbed_overrides: tuple[str, ...] = ("teachers.enabled=false", "diffusion.enabled=false")
    task: str = choice("countdown", task_names)
    # Training seeds; every method trains once per seed from the same base model.
    seeds: tuple[int, ...] = (0, 1, 2)
    # Generated samples per training run, the same for every method: ES iterations and GRPO
    # steps are derived from it, so it must be a multiple of every per-step sample count.
    budget_samples: int = 40960
    # MPI ranks of the ES runs (`mpirun -n ranks`).
    ranks: int = 2
    # The methods by name (the report's labels, runs/<name>-seed<k>): a YAML `methods:`
    # mapping replaces this default as a whole.
    methods: dict[str, Method] = field(default_factory=_default_methods)
    # Untrained models compared beside the base: a label and a folder inside the testbed
    # (e.g. swa_no_sft: swa/no_sft).
    references: dict[str, str] = field(default_factory=dict)
    # LatentRevise's recovery of zero-hit training prompts, before the methods train.
    latent_revise: RecoverStage = field(default_factory=RecoverStage)
    # How the comparison samples every model (identical for all), on how many of the
    # held-out problems (None = all) and with which backend.
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_limit: int | None = None
    eval_backend: str = choice("auto", lambda: BACKEND_NAMES)
    # Capability or sharpening: the comparison also reads every model greedily and sampled
    # at these temperatures (and sampling.temperature), on the held-out file and on a
    # never-seen set of never_seen_per_tier problems per tier (scripts/unseen_countdown.py,
    # seed never_seen_seed; 0 = no such set), with views_n samples per problem. Off by
    # default ([] and 0): the comparison then reads the held-out file at `sampling` only.
    temperatures: tuple[float, ...] = ()
    never_seen_per_tier: int = 0
    never_seen_seed: int = 0
    views_n: int = 8
    # Accuracy against training budget in the report: every checkpoint along each run (the
    # extended ones where a method has them) and the base model read on the never-seen set
    # (else the held-out file), with the `budget` settings of `es-llm compare`; its runs
    # are filled in here.
    budget_study: bool = False
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    # SWARR: the window sweep and the study's table.
    swarr: WindowStudy = field(default_factory=WindowStudy)
    # More settings of `es-llm compare` as key=value, for the sections the experiment does
    # not set itself, e.g. geometry.enabled=true drift.enabled=true connectivity.n=8
    # "connectivity.pairs=[reference:es@0,es@0:grpo@0]" (checked before anything runs).
    compare_overrides: tuple[str, ...] = ()

    def __post_init__(self):
        check_choices(self)
        self._check_numbers()
        self._check_swarr()
        self._check_compare_overrides()
        if not self.methods:
            raise BadInput("methods is empty; name at least one, e.g. methods: {es: {kind: es, "
                           "config: configs/es_countdown.yaml}}.")
        if self.budget.runs:
            raise BadInput("budget.runs is filled in by the experiment (every run of every "
                           "method); leave it empty and set budget_study: true.")
        clash = set(self.references) & set(self.methods)
        if clash or "base" in self.references:
            raise BadInput(f"references may not reuse a method's name or 'base': "
                           f"{sorted(clash | ({'base'} & set(self.references)))}.")
        for name in self.references:
            if not name.replace("_", "").isalnum():
                raise BadInput(f"reference name {name!r} must be letters, digits and _.")
        for name, m in self.methods.items():
            if name in ("base",) or not name.replace("_", "").isalnum():
                raise BadInput(f"method name {name!r} must be letters, digits and _ and not "
                               f"'base' (the base model's label).")
            missing = sorted(set(m.extend_seeds) - set(self.seeds)) if m.extend > 1 else []
            if missing:
                raise BadInput(f"methods.{name}.extend_seeds {missing} are not training seeds "
                               f"(seeds: {list(self.seeds)}).")

    def _check_compare_overrides(self) -> None:
        """BadInput for a comparison setting the experiment gives from its own fields."""
        for text in self.compare_overrides:
            top = parse_override(text)[0][0]
            if top in SET_BY_EXPERIMENT:
                raise BadInput(f"compare_overrides may not set {top} ({text!r}): the "
                               f"experiment sets it from its own {SET_BY_EXPERIMENT[top]}. "
                               f"compare_overrides is for the comparison's other sections "
                               f"(geometry, connectivity, drift, blind_spot, testtime, "
                               f"bootstrap, ...).")

    def _check_swarr(self) -> None:
        """BadInput for a sweep with nothing to sweep, or a table naming what is not there."""
        w = self.swarr
        converted = {n for n, m in self.methods.items() if in_conversion(m.model)} | {
            n for n, folder in self.references.items() if in_conversion(folder)}
        if w.windows is not None:
            if self.model:
                raise BadInput("swarr.windows converts the testbed's student once per window; "
                               "with a model of your own (model=PATH) set swarr.windows to "
                               "null.")
            if not converted:
                raise BadInput("swarr.windows is set but no method or reference starts from the "
                               "conversion (model: swa, or a reference inside swa/); the sweep "
                               "would train nothing under a window.")
            names = [a for n in converted for a in w.arm_names(n)]
            clash = sorted(set(names) & (set(self.methods) | set(self.references)))
            if clash:
                raise BadInput(f"the sweep names its arms <name>_w<window>, and {clash} are "
                               f"already methods or references; rename them.")
        if not w.converted:
            if w.rl:
                raise BadInput("swarr.rl needs swarr.converted: the reference that is the "
                               "converted model the recovered share is measured from.")
            return
        if w.converted not in self.references:
            raise BadInput(f"swarr.converted {w.converted!r} is not a reference "
                           f"({sorted(self.references)}); name the converted model's.")
        if not w.rl:
            raise BadInput("swarr.rl is empty; name the methods trained under the window, "
                           "e.g. {grpo_swa: grpo_full}.")
        for rl, full in w.rl.items():
            if rl not in self.methods or (full and full not in self.methods):
                raise BadInput(f"swarr.rl maps methods to methods, got {rl}: {full!r} "
                               f"(methods: {sorted(self.methods)}).")
            if w.windows is not None and (rl not in converted or full in converted
                                          or w.converted not in converted):
                raise BadInput(f"with a sweep, swarr.converted and the keys of swarr.rl start "
                               f"from the conversion and its values do not; got "
                               f"{w.converted}, {rl}: {full!r}.")

    def _check_numbers(self) -> None:
        """BadInput for a seed list, budget, rank count or comparison size no stage could
        run with."""
        if not self.seeds:
            raise BadInput("seeds is empty; give at least one training seed (every method "
                           "trains once per seed), e.g. seeds: [0, 1, 2].")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:
            raise BadInput(f"seeds {list(self.seeds)} repeat {repeated}; each seed is one run "
                           f"per method (runs/<name>-seed<k>), so list each once.")
        if self.budget_samples < 1:
            raise BadInput(f"budget_samples must be at least 1 generated sample per training "
                           f"run, got {self.budget_samples}.")
        if self.ranks < 1:
            raise BadInput(f"ranks must be at least 1 (the MPI ranks of each ES run; 1 runs it "
                           f"without mpirun), got {self.ranks}.")
        if self.eval_limit is not None and self.eval_limit < 1:
            raise BadInput(f"eval_limit must be at least 1 held-out problem, or null for all of "
                           f"them, got {self.eval_limit}.")
        if any(not t > 0 for t in self.temperatures):
            raise BadInput(f"temperatures must be above 0 (the comparison reads every model "
                           f"greedily whenever they are set), got {list(self.temperatures)}.")
        if self.eval_select is not None:
            parse_select(self.eval_select)
        if self.model and self.never_seen_per_tier:
            raise BadInput("never_seen_per_tier draws problems the testbed never trained on; "
                           "with a model of your own (model=PATH) set it to 0 and give the "
                           "problems to read as eval_data.")
        if self.never_seen_per_tier < 0:
            raise BadInput(f"never_seen_per_tier must be 0 (no never-seen set) or a number of "
                           f"problems per tier, got {self.never_seen_per_tier}.")
        if self.views_n < 1:
            raise BadInput(f"views_n must be at least 1 sample per problem, got {self.views_n}.")


@dataclass(frozen=True)
class Trainer:
    # Training config (a YAML under configs/), its overrides, and the run's length: GRPO
    # steps or ES iterations, the same for every build (a fixed post-training budget).
    config: str = ""
    overrides: tuple[str, ...] = ()
    length: int = 10

    def __post_init__(self):
        if not self.config or self.length < 2:
            raise BadInput(f"grpo and es need a config (a YAML under configs/) and a length "
                           f">= 2 (a reward slope needs two points), got "
                           f"config={self.config!r}, length={self.length}.")


@dataclass(frozen=True)
class SFTStage:
    # Between pretraining and RL, SFT on freshly generated worked traces (Countdown only:
    # chess completions here are the move alone), `traces` rows for `epochs` epochs.
    enabled: bool = True
    traces: int = 2000
    epochs: int = 1
    batch_size: int = 32
    lr: float = 3e-4

    def __post_init__(self):
        if self.traces < 1 or self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise BadInput("sft needs traces, epochs and batch_size >= 1 and lr > 0.")


@dataclass(frozen=True)
class Calibration:
    # Before the grid: one cell (<size>-<steps>; null = no calibration) runs all its stages,
    # and the study stops (exit 2, no other cell run) unless `method`'s post-training gain
    # there, pass@1 of the seeds' mean minus the base's, has a 95% interval over problems
    # above 0: a grid at a budget that moves no build measures the budget, not the builds.
    cell: str | None = None
    method: str = choice("grpo", lambda: ("grpo", "es"))

    def __post_init__(self):
        check_choices(self, "calibration.")


@dataclass(frozen=True)
class ScalingConfig:
    # The domain: countdown (the student's mix) or chess (the chess domain model).
    domain: str = choice("countdown", lambda: tuple(DOMAINS))
    # Testbed preset every build starts from, and overrides applied to all of them.
    testbed: str = "default"
    testbed_overrides: tuple[str, ...] = ("teachers.enabled=false",)
    # Model shapes by name (ModelShape fields; head size hidden_size / num_heads in 32, 64, ...)
    # and pretraining steps: every size is built at every step count.
    sizes: dict[str, ModelShape] = field(default_factory=dict)
    pretrain_steps: tuple[int, ...] = ()
    # Examples of the held-out stream each build's loss is measured on.
    heldout_examples: int = 512
    sft: SFTStage = field(default_factory=SFTStage)
    grpo: Trainer = field(default_factory=lambda: Trainer("configs/grpo_countdown.yaml"))
    es: Trainer = field(default_factory=lambda: Trainer("configs/es_countdown.yaml"))
    # MPI ranks of the ES runs (`mpirun -n ranks`; 1 = no mpirun).
    ranks: int = 1
    # Training seeds of every build, and further seeds for the builds named in
    # more_seeds_for (cell names <size>-<steps>).
    seeds: tuple[int, ...] = (0,)
    more_seeds: tuple[int, ...] = (1, 2)
    more_seeds_for: tuple[str, ...] = ()
    # The run seed of training seed k (prompt batches, sampling, noise): per_cell draws it
    # from the cell's name and k, so builds see different batch orders; shared gives every
    # build seed k, the same batches in the same order (their reward curves then share the
    # batches' difficulty; the report's shared-batch correlation measures it).
    batch_order: str = choice("per_cell", lambda: ("per_cell", "shared"))
    calibration: Calibration = field(default_factory=Calibration)
    # How every model is sampled on the held-out set (pass@1 and pass@n), on how many
    # problems (null = all) and with which backend.
    eval: SamplingConfig = field(default_factory=lambda: SamplingConfig(n=16))
    eval_limit: int | None = None
    eval_backend: str = choice("auto", lambda: ("auto", "hf", "vllm"))
    bootstrap: int = 1000

    def __post_init__(self):
        check_choices(self)
        if not self.sizes or not self.pretrain_steps:
            raise BadInput("the grid is empty: give at least one model size (sizes: {name: "
                           "{hidden_size: ..., num_layers: ..., ...}}) and one pretraining "
                           "step count (pretrain_steps: [500, 1000]).")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1
               for s in self.pretrain_steps):
            raise BadInput(f"pretrain_steps must be positive whole numbers, got "
                           f"{list(self.pretrain_steps)}.")
        for name in self.sizes:
            if not name.replace("_", "").isalnum():
                raise BadInput(f"size name {name!r} must be letters, digits and _.")
        unknown = sorted(set(self.more_seeds_for) - set(self.cells()))
        if unknown:
            raise BadInput(f"more_seeds_for names {unknown}, which are not cells of the grid "
                           f"({', '.join(self.cells())}).")
        if self.calibration.cell is not None and self.calibration.cell not in self.cells():
            raise BadInput(f"calibration.cell names {self.calibration.cell!r}, which is not a "
                           f"cell of the grid ({', '.join(self.cells())}); give one, or null "
                           f"for no calibration.")
        if self.heldout_examples < 1 or self.ranks < 1 or self.bootstrap < 10:
            raise BadInput("heldout_examples and ranks must be >= 1 and bootstrap >= 10.")
        if self.eval_limit is not None and (isinstance(self.eval_limit, bool)
                                            or not isinstance(self.eval_limit, int)
                                            or self.eval_limit < 1):
            raise BadInput(f"eval_limit must be a whole number >= 1 (the first that many "
                           f"held-out problems) or null (all of them), got {self.eval_limit!r}.")

    def cells(self) -> list[str]:
        return [f"{size}-{steps}" for size in self.sizes for steps in self.pretrain_steps]

    def seeds_of(self, cell: str) -> tuple[int, ...]:
        return self.seeds + (self.more_seeds if cell in self.more_seeds_for else ())
