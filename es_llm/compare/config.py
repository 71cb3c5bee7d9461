"""The settings of ``es-llm compare``: ``CompareConfig`` and the nested settings of its
sections (the blind spot, the budget study, the test-time curves, the update geometry, the
linear connectivity, the off-task drift and a conversion study's table)."""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.backends import BACKEND_NAMES
from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from es_llm.evaluate import SamplingConfig
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig
from populations.numbers import is_finite_number


@dataclass(frozen=True)
class BlindSpotConfig:
    # The pass@k blind spot (es_llm/compare/blind_spot.py): for each model folder, the
    # problems none of its first k samples solves, read again by greedy decoding and five
    # grafted greedy chains.
    enabled: bool = False
    # Sampled tries that define a never-solved problem (the first k of each problem's).
    k: int = 6
    # Decoder layer whose output is grafted; negative counts from the end (-1 = the last).
    layer: int = 0
    # Coefficients of the three graft kinds (0 = no change, 1 = the donor replaces).
    reorder_coef: float = 1.0
    mean_coef: float = 0.5
    mix_coef: float = 0.1
    # Prompts of the compared set whose mean activation is the mean graft's donor.
    reference_prompts: int = 32
    # At most this many never-solved problems per model are read (null = all of them).
    max_problems: int | None = None

    def __post_init__(self):
        if self.k < 1:
            raise BadInput(f"blind_spot.k must be at least 1, got {self.k}.")
        for name in ("reorder_coef", "mean_coef", "mix_coef"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0 <= value <= 1):
                raise BadInput(f"blind_spot.{name} must lie in [0, 1], got {value!r}.")
        if self.reference_prompts < 1:
            raise BadInput(f"blind_spot.reference_prompts must be at least 1, got "
                           f"{self.reference_prompts}.")
        if self.max_problems is not None and self.max_problems < 1:
            raise BadInput(f"blind_spot.max_problems must be at least 1 or null, got "
                           f"{self.max_problems}.")


@dataclass(frozen=True)
class BudgetConfig:
    # Training runs read checkpoint by checkpoint, as METHOD@SEED=RUN_DIR (or METHOD=RUN_DIR):
    # every checkpoints/step_K and final of an `es-llm es` or `es-llm grpo` run folder.
    runs: tuple[str, ...] = ()
    # Problems every checkpoint and the reference model are read on; null = the first
    # also_on file, else the reference model's held-out file.
    data: str | None = None
    # Sampled reads per problem (0 = greedy only), at this temperature, on every stride-th
    # problem of the data; pass@k reported for each k (at most n).
    n: int = 4
    temperature: float = 0.6
    stride: int = 4
    k: tuple[int, ...] = (1, 4)
    # Generation backend of these reads (null = the comparison's): dozens of short reads are
    # quicker on hf where vLLM's start-up per read dominates.
    backend: str | None = None

    def __post_init__(self):
        if self.backend not in (None, "auto", "hf", "vllm"):
            raise BadInput(f"budget.backend must be null (the comparison's), auto, hf or vllm; "
                           f"got {self.backend!r}.")
        if self.n < 0 or self.stride < 1 or not self.temperature > 0:
            raise BadInput(f"budget.n must be >= 0, budget.stride >= 1 and budget.temperature "
                           f"> 0; got n={self.n}, stride={self.stride}, "
                           f"temperature={self.temperature}.")
        if self.n and (not self.k or any(k < 1 or k > self.n for k in self.k)):
            raise BadInput(f"budget.k {list(self.k)} must be between 1 and budget.n={self.n} "
                           f"samples per problem.")


@dataclass(frozen=True)
class TestTimeCompare:
    __test__ = False  # not a pytest test class, despite its name

    # Test-time methods to run on every model folder (empty = off), e.g. [independent,
    # base_oracle]; a method's roles must be in every model (checkpoints of the student know
    # only solve: independent, base_oracle).
    methods: tuple[str, ...] = ()
    # Budget levels in each method's unit, as `es-llm testtime --budgets`.
    budgets: tuple[int, ...] = (2, 4, 8)


@dataclass(frozen=True)
class GeometryConfig:
    # Update geometry (es_llm/compare/geometry.py): every model folder's weights against the
    # reference's, their common base: update norms, the share of entries moved, the
    # effective rank and top-k energy of each matrix's update, and the cosine between every
    # two models' updates.
    enabled: bool = False
    # An entry counts as moved when it changed by more than this (absolute, in the weights'
    # units): 0 counts every change, bf16 rounding included.
    tolerance: float = 1e-6
    # Leading singular values whose share of a matrix update's energy (sum of squared
    # singular values) is reported.
    top_k: int = 4

    def __post_init__(self):
        if not (is_finite_number(self.tolerance) and self.tolerance >= 0):
            raise BadInput(f"geometry.tolerance must be a number >= 0, got {self.tolerance!r}.")
        if self.top_k < 1:
            raise BadInput(f"geometry.top_k must be at least 1, got {self.top_k}.")


@dataclass(frozen=True)
class ConnectivityConfig:
    # Linear connectivity (es_llm/compare/connectivity.py): greedy accuracy and sampled pass@1
    # of the weights (1 - alpha) A + alpha B along each pair, and the barrier height with its
    # CI over problems. Setting pairs turns it on too.
    enabled: bool = False
    # Endpoint pairs as A:B, each a model name of the comparison or `reference`; empty = the
    # reference to every other model folder.
    pairs: tuple[str, ...] = ()
    # Interpolation points in [0, 1]; 0 and 1 (the endpoints themselves) are required.
    alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    # Samples per problem of the sampled pass@1 curve (null = sampling.n): every point of
    # every pair is a model read in full, and pass@1 needs far fewer samples than pass@k.
    n: int | None = None

    def __post_init__(self):
        if self.n is not None and self.n < 1:
            raise BadInput(f"connectivity.n must be at least 1 sample per problem (or null "
                           f"for sampling.n), got {self.n}.")
        bad = [p for p in self.pairs if p.count(":") != 1 or "" in p.split(":")]
        if bad:
            raise BadInput(f"connectivity.pairs entries must be A:B (model names of the "
                           f"comparison or `reference`, e.g. reference:es@0 es@0:grpo@0); got "
                           f"{', '.join(map(repr, bad))}.")
        outside = [a for a in self.alphas if not (is_finite_number(a) and 0 <= a <= 1)]
        if outside or 0 not in self.alphas or 1 not in self.alphas:
            raise BadInput(f"connectivity.alphas must lie in [0, 1] and include both endpoints "
                           f"0 and 1 (e.g. [0, 0.25, 0.5, 0.75, 1]); got {list(self.alphas)}.")


@dataclass(frozen=True)
class DriftConfig:
    # Off-task drift (es_llm/compare/drift.py): every model's greedy accuracy on problem sets
    # it was not trained on, its paired change against the reference with a CI over problems,
    # and the mean per-token KL(model || reference) on its own greedy completions there.
    enabled: bool = False
    # Off-task problem files as FILE (read as the comparison's task) or TASK=FILE, e.g.
    # arithmetic=base/data/arithmetic_eval.jsonl or a Countdown tier outside training from
    # scripts/unseen_countdown.py; task.limit applies to each. Empty = the reference model's
    # data/arithmetic_eval.jsonl (a testbed model's held-out arithmetic set).
    tasks: tuple[str, ...] = ()
    # The KL is averaged over the first this many problems of each file.
    kl_prompts: int = 32

    def __post_init__(self):
        if self.kl_prompts < 1:
            raise BadInput(f"drift.kl_prompts must be at least 1 (problems whose completions "
                           f"the KL is averaged over), got {self.kl_prompts}.")
        bad = [t for t in self.tasks if "=" in t and "" in t.split("=", 1)]
        if bad:
            raise BadInput(f"drift.tasks entries must be FILE or TASK=FILE (e.g. "
                           f"arithmetic=base/data/arithmetic_eval.jsonl); got "
                           f"{', '.join(map(repr, bad))}.")


@dataclass(frozen=True)
class ConversionArm:
    # The model before the conversion (e.g. full attention), the converted model (after its
    # own SFT), the method trained under the conversion and the same method trained on the
    # unconverted model ("" = none): model names of the comparison, or method names for the
    # seed mean of all their training seeds.
    full: str = "base"
    converted: str = ""
    rl: str = ""
    rl_full: str = ""

    def __post_init__(self):
        if not (self.full and self.converted and self.rl):
            raise BadInput(f"a conversion arm needs full, converted and rl (model or method "
                           f"names of the comparison; rl_full may be empty), got "
                           f"full={self.full!r}, converted={self.converted!r}, "
                           f"rl={self.rl!r}.")
        names = [n for n in (self.full, self.converted, self.rl, self.rl_full) if n]
        if len(set(names)) != len(names):
            raise BadInput(f"a conversion arm's full, converted, rl and rl_full must be four "
                           f"different models, got {names}.")


@dataclass(frozen=True)
class CompareConfig:
    # Models as NAME=PATH: PATH is a model folder (sampled here), an eval folder or a
    # samples.jsonl (reused). NAME is a method, or method@seed for one of its training seeds.
    models: tuple[str, ...] = ()
    # The model (or method) progressions, regressions and differences are measured against.
    reference: str = "base"
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Generation backend for the models sampled here: auto (vLLM when installed), hf or vllm.
    backend: str = choice("auto", lambda: BACKEND_NAMES)
    # Device, dtype, context length and engine memory every model is sampled with.
    runtime: Runtime = field(default_factory=Runtime)
    # Compare models whose training runs used different runtime.dtype (each run folder's
    # config.yaml says); refused by default, as precision alone moves the results.
    mixed_precision: bool = False
    # Bootstrap resamples over problems for each 95% interval.
    bootstrap: int = 1000
    # Seed of the bootstrap resamples and of the diversity subsamples.
    metrics_seed: int = 0
    # Refuse (exit 2) to compare a training run's checkpoint on problems that run trained
    # on (the same prompt); false only warns.
    strict_overlap: bool = False
    # Capability or sharpening (es_llm/compare/capability.py): when either list is set, every
    # model folder is also read greedily (one sample at T = 0) and sampled at each of these
    # temperatures and at sampling.temperature (views_n samples per problem, the other
    # sampling settings as given), on the task's problems and on each `also_on` file; the
    # report adds greedy accuracy, pass@1, pass@n, answer entropy and the sharpening gap
    # side by side.
    temperatures: tuple[float, ...] = ()
    # More problem files to read the models on, e.g. a never-seen Countdown set from
    # scripts/unseen_countdown.py.
    also_on: tuple[str, ...] = ()
    # Samples per problem in the sampled capability views (null = sampling.n): a large
    # never-seen set is read well with fewer samples per problem.
    views_n: int | None = None
    # Accuracy against training budget: every checkpoint along budget.runs read on one
    # problem set, placed by generated samples and by training seconds.
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    # Per-problem difficulty for the "gains by difficulty" section (besides the reference's
    # failure rate and the problems' tiers): a JSONL file with an `id` and this column per
    # problem, e.g. human error rates; every compared problem needs a value.
    difficulty_file: str | None = None
    # The column of difficulty_file that holds each problem's difficulty.
    difficulty_column: str = "difficulty"
    blind_spot: BlindSpotConfig = field(default_factory=BlindSpotConfig)
    # Test-time methods on every model folder (es_llm/compare/testtime.py).
    testtime: TestTimeCompare = field(default_factory=TestTimeCompare)
    geometry: GeometryConfig = field(default_factory=GeometryConfig)
    connectivity: ConnectivityConfig = field(default_factory=ConnectivityConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    # A conversion study's table (es_llm/compare/conversion.py, SWARR's sliding window): per
    # arm, by its label, pass@1 per tier of its four models, the share of the conversion's
    # loss that RL recovers and RL under the conversion minus RL on the unconverted model,
    # each with a paired CI over problems; empty = off. An arm's keys: full (default base),
    # converted, rl, rl_full, e.g. conversion.w16.converted=swa_sft conversion.w16.rl=grpo_swa.
    conversion: dict[str, ConversionArm] = field(default_factory=dict)

    def __post_init__(self):
        check_choices(self)
        bad = [a for a in self.conversion if not a.replace("_", "").isalnum()]
        if bad:
            raise BadInput(f"conversion arm labels must be letters, digits and _, got "
                           f"{', '.join(map(repr, bad))}.")
        if self.bootstrap < 10:
            raise BadInput(f"bootstrap must be at least 10 resamples, got {self.bootstrap}.")
        if any(not t > 0 for t in self.temperatures):
            raise BadInput(f"temperatures must be above 0 (greedy is always read when views "
                           f"are on), got {list(self.temperatures)}.")
        if self.views_n is not None and self.views_n < 1:
            raise BadInput(f"views_n must be at least 1 (or null for sampling.n), got "
                           f"{self.views_n}.")
        if self.task.chat.template and (self.blind_spot.enabled or self.testtime.methods):
            raise BadInput("task.chat.template=on is for the sampled comparison only: the blind "
                           "spot reorders raw Countdown prompts and the test-time methods write "
                           "their own; turn blind_spot.enabled and testtime.methods off, or "
                           "leave the template off.")
