"""The testbed's config: model shape, training data mix, training schedule, held-out sets.

The dataclass defaults are the ``default`` size; ``presets/ci.yaml`` and
``presets/default.yaml`` (package data) are what ``--size`` selects.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from es_llm.config import check_choices, choice, load_config, to_dict
from es_llm.diffusion.sampler import DiffusionSampling
from es_llm.errors import BadInput
from es_llm.testbed import SIZES

# Domain model sections of the config and the task each one learns.
DOMAINS = {"code": "pyfunc", "chess": "chess"}
# Every model section built like a domain and the task it is evaluated on: the domains, the
# multi-role reasoning model (Countdown in several roles, es_llm/tasks/countdown_roles.py)
# and the knowledge model (facts of a fixed world, composed, es_llm/tasks/knowledge.py).
MODEL_TASKS = {**DOMAINS, "reasoning": "countdown", "knowledge": "knowledge"}
# The module whose ``generate(rng, tier)`` makes a section's training examples (and whose
# ``held_out``, where it has one, its held-out problems).
EXAMPLE_MODULES = {"code": "es_llm.tasks.pyfunc", "chess": "es_llm.tasks.chess",
                   "reasoning": "es_llm.tasks.countdown_roles",
                   "knowledge": "es_llm.tasks.knowledge"}


def _at_least(owner: str, obj, minimum, *names: str) -> None:
    """BadInput unless every field ``names`` of ``obj`` is at least ``minimum``."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value >= minimum:
            raise BadInput(f"{owner}.{name} must be at least {minimum}, got {value!r}.")


@dataclass(frozen=True)
class ModelShape:
    # Llama decoder: width, depth, heads (query and key/value), MLP width. vLLM's CPU
    # attention needs a head size (hidden_size / num_heads) of 32, 64, 80, 96, 112 or 128+.
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    # Longest prompt + completion the model (and vLLM's max_model_len) supports.
    max_positions: int = 256

    def __post_init__(self):
        _at_least("model", self, 1, "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                  "intermediate_size", "max_positions")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise BadInput(f"model shape: hidden_size ({self.hidden_size}) must be divisible by "
                           f"num_heads ({self.num_heads}), and num_heads by num_kv_heads "
                           f"({self.num_kv_heads}).")
        head_size = self.hidden_size // self.num_heads
        if head_size not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
            raise BadInput(f"model shape: head size hidden_size/num_heads = {head_size} is not "
                           f"supported by vLLM's CPU attention; use 32, 64, 80, 96, 112 or 128.")


@dataclass(frozen=True)
class DataMix:
    # Countdown tiers (how many numbers) and the share of training examples of each.
    countdown_tiers: tuple[int, ...] = (2, 3, 4)
    countdown_weights: tuple[float, ...] = (0.3, 0.4, 0.3)
    # Largest number drawn (null = the generator's per-tier default, 3 * numbers + 3) and
    # largest target allowed in Countdown problems.
    countdown_max_number: int | None = None
    countdown_max_target: int = 99
    # Arithmetic tiers (how many operands) and the share of all examples that are arithmetic.
    arithmetic_tiers: tuple[int, ...] = (2, 3, 4)
    arithmetic_share: float = 0.2
    # Held-out problems per tier, never seen in training: `eval` for evaluation, `rl` for
    # post-training prompts (ES, GRPO).
    eval_per_tier: int = 100
    rl_per_tier: int = 200
    # A larger pool of Countdown training prompts for post-training, up to this many per tier
    # (data/countdown_rl_pool.jsonl; 0 = none): disjoint from the eval and rl sets, but not
    # withheld from pretraining, so adding it leaves the model unchanged.
    rl_pool_per_tier: int = 0
    # Unreliable ways of solving in the Countdown pretraining traces (es_llm/testbed/
    # habits.py), each a share of every tier's traces, one per countdown_tier ([] = 0): a
    # guess states the answer without steps, a slip writes one step's result off by 1-3 and
    # carries it on. Held-out and never-seen problems keep clean references.
    guess_rates: tuple[float, ...] = ()
    slip_rates: tuple[float, ...] = ()

    def __post_init__(self):
        _at_least("data", self, 1, "countdown_max_number", "countdown_max_target",
                  "eval_per_tier")
        _at_least("data", self, 0, "rl_per_tier", "rl_pool_per_tier")
        if not self.countdown_tiers or any(not 2 <= t <= 8 for t in self.countdown_tiers):
            raise BadInput(f"data.countdown_tiers must be a non-empty list of numbers from 2 "
                           f"to 8 (how many numbers a problem gives), got "
                           f"{list(self.countdown_tiers)}.")
        if any(not 2 <= t <= 8 for t in self.arithmetic_tiers):
            raise BadInput(f"data.arithmetic_tiers must be numbers of operands from 2 to 8, "
                           f"got {list(self.arithmetic_tiers)}.")
        if any(not w >= 0 for w in self.countdown_weights) or not sum(self.countdown_weights) > 0:
            raise BadInput(f"data.countdown_weights must be non-negative with a positive sum, "
                           f"got {list(self.countdown_weights)}.")
        if len(self.countdown_tiers) != len(self.countdown_weights):
            raise BadInput("data.countdown_tiers and data.countdown_weights must have the same "
                           f"length, got {len(self.countdown_tiers)} and {len(self.countdown_weights)}.")
        if not 0 <= self.arithmetic_share < 1:
            raise BadInput(f"data.arithmetic_share must lie in [0, 1), got {self.arithmetic_share}.")
        for name in ("guess_rates", "slip_rates"):
            rates = getattr(self, name)
            if rates and (len(rates) != len(self.countdown_tiers)
                          or any(not 0 <= r <= 1 for r in rates)):
                raise BadInput(f"data.{name} must be empty or one share in [0, 1] per countdown "
                               f"tier {list(self.countdown_tiers)}, got {list(rates)}.")
        if any(g + s > 1 for g, s in zip(self.guess_rates, self.slip_rates)):
            raise BadInput(f"data.guess_rates + data.slip_rates must be at most 1 per tier, got "
                           f"{list(self.guess_rates)} and {list(self.slip_rates)}.")

    def habit_rates(self, tier: int) -> tuple[float, float]:
        """(guess, slip) shares of the traces of Countdown ``tier``."""
        i = self.countdown_tiers.index(tier)
        return (self.guess_rates[i] if self.guess_rates else 0.0,
                self.slip_rates[i] if self.slip_rates else 0.0)


@dataclass(frozen=True)
class TrainSchedule:
    # Optimizer steps of pretraining, each on a batch of this many freshly drawn examples.
    steps: int = 3000
    batch_size: int = 64
    # AdamW's peak learning rate, reached after a linear warmup of warmup_steps (then
    # cosine decay), and its weight decay.
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    # Torch threads for training (0 = torch's default).
    threads: int = 0

    def __post_init__(self):
        _at_least("train", self, 1, "steps", "batch_size")
        _at_least("train", self, 0, "warmup_steps", "weight_decay", "threads")
        if not self.lr > 0:
            raise BadInput(f"train.lr must be > 0, got {self.lr}.")


@dataclass(frozen=True)
class StrongTeacher:
    # A larger model than the student, pretrained for longer on the same mix (the held-out
    # sets stay excluded): the teacher of on-policy distillation.
    model: ModelShape = field(default_factory=lambda: ModelShape(
        hidden_size=192, num_layers=4, num_heads=3, num_kv_heads=1, intermediate_size=576))
    train: TrainSchedule = field(default_factory=lambda: TrainSchedule(steps=1500, lr=2e-3))


@dataclass(frozen=True)
class WeakPair:
    # A smaller model of the student's family before (`weak_base`) and after (`weak_rl`) a
    # short REINFORCE run on the held-out RL prompts: the contrast pair of W2S-OPD.
    model: ModelShape = field(default_factory=lambda: ModelShape(
        hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=384))
    train: TrainSchedule = field(default_factory=lambda: TrainSchedule(steps=1000, lr=3e-3))
    # REINFORCE with the group-mean baseline: steps, prompts per step, samples per prompt,
    # AdamW learning rate (sampling at temperature 1, up to report.max_tokens tokens).
    rl_steps: int = 40
    rl_prompts: int = 16
    rl_group: int = 8
    rl_lr: float = 1e-4

    def __post_init__(self):
        for name in ("rl_prompts", "rl_group"):
            if getattr(self, name) < 1:
                raise BadInput(f"teachers.weak.{name} must be at least 1, got "
                               f"{getattr(self, name)}.")
        if self.rl_steps < 0 or not self.rl_lr > 0:
            raise BadInput("teachers.weak.rl_steps must be >= 0 and teachers.weak.rl_lr > 0.")


@dataclass(frozen=True)
class Teachers:
    # Build the teachers beside the student (under teachers/ in the testbed folder).
    enabled: bool = True
    strong: StrongTeacher = field(default_factory=StrongTeacher)
    weak: WeakPair = field(default_factory=WeakPair)
    # Samples per held-out problem for each teacher's pass@1 in testbed.json.
    report_samples: int = 4

    def __post_init__(self):
        _at_least("teachers", self, 1, "report_samples")


@dataclass(frozen=True)
class EncoderShape:
    # The diffusion model's encoder: bert or modernbert; width, depth, heads, MLP width.
    arch: str = choice("bert", lambda: ("bert", "modernbert"))
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 256

    def __post_init__(self):
        check_choices(self, "diffusion.model.")
        if self.hidden_size % self.num_heads:
            raise BadInput(f"diffusion.model: hidden_size ({self.hidden_size}) must be "
                           f"divisible by num_heads ({self.num_heads}).")


@dataclass(frozen=True)
class DiffusionLM:
    # Build a masked-diffusion LM beside the student (under diffusion/ in the testbed folder):
    # the same data mix and tokenizer, a bidirectional encoder, LLaDA's objective. Off by
    # default until its calibration reaches non-zero pass rates (docs/benchmarks.md).
    enabled: bool = False
    model: EncoderShape = field(default_factory=EncoderShape)
    train: TrainSchedule = field(default_factory=lambda: TrainSchedule(steps=2000, lr=1e-3))
    # The sampler saved with the model (diffusion_sampling.json), which evaluation, ES and
    # RL use unless told otherwise; gen_length is also the training canvas.
    sampling: DiffusionSampling = field(default_factory=lambda: DiffusionSampling(
        gen_length=64, block_length=16, steps=32))


@dataclass(frozen=True)
class DomainLM:
    # Build a causal LM of the student's family pretrained on one more task domain, beside
    # the student (under code/ for pyfunc, chess/ for chess), with its own held-out sets.
    enabled: bool = False
    model: ModelShape = field(default_factory=ModelShape)
    train: TrainSchedule = field(default_factory=lambda: TrainSchedule(steps=1500))
    # The task's tiers to learn (empty = all) and each one's share of training examples
    # (empty = equal shares).
    tiers: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()
    # Held-out problems per tier: `eval` for evaluation, `rl` for post-training prompts.
    eval_per_tier: int = 100
    rl_per_tier: int = 100
    # Train on a pool of this many generated examples per tier, drawn once (0 = a fresh
    # example every time): for tasks whose generator is too slow to feed training directly.
    pool_per_tier: int = 0

    def __post_init__(self):
        if isinstance(self.tiers, list):
            object.__setattr__(self, "tiers", tuple(self.tiers))
        if isinstance(self.weights, list):
            object.__setattr__(self, "weights", tuple(self.weights))
        if self.weights and len(self.weights) != len(self.tiers):
            raise BadInput(f"a domain's weights must be empty or one per tier, got "
                           f"{len(self.weights)} weights for tiers {list(self.tiers)}.")
        if any(not w >= 0 for w in self.weights) or (self.weights and not sum(self.weights) > 0):
            raise BadInput(f"a domain's weights must be non-negative with a positive sum, got "
                           f"{list(self.weights)}.")
        for name in ("eval_per_tier", "rl_per_tier", "pool_per_tier"):
            if getattr(self, name) < 0:
                raise BadInput(f"a domain's {name} must be >= 0, got {getattr(self, name)}.")


@dataclass(frozen=True)
class SlidingWindow:
    # SWARR's converted model (swa/ in the testbed folder, and swa/no_sft/): the student's
    # weights in a decoder whose chosen layers attend over a sliding window, then SFT on the
    # student's pretraining mix under that window (es_llm/testbed/swa.py).
    enabled: bool = False
    # Keys a query of a sliding layer sees, itself included: the query at position i
    # attends to positions i-window+1 .. i (transformers' and vLLM's convention, tested).
    window: int = 16
    # The layers that slide, 0-based ([] = every layer); the others keep full attention.
    layers: tuple[int, ...] = ()
    # The conversion SFT on the student's pretraining mix.
    train: TrainSchedule = field(default_factory=lambda: TrainSchedule(
        steps=400, lr=1e-3, warmup_steps=20))

    def __post_init__(self):
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        if not self.window >= 1:
            raise BadInput(f"swa.window must be a positive number of tokens, got "
                           f"{self.window!r}.")


@dataclass(frozen=True)
class ReportEval:
    # The build ends with a quick evaluation on the held-out countdown set: samples per
    # problem, temperature, longest completion.
    samples: int = 16
    temperature: float = 1.0
    max_tokens: int = 64

    def __post_init__(self):
        _at_least("report", self, 1, "samples", "max_tokens")
        _at_least("report", self, 0, "temperature")


@dataclass(frozen=True)
class TestbedConfig:
    # The preset this config started from (ci, default or habits): part of the cache key's
    # name.
    size: str = "default"
    # Seed of the held-out sets, the data stream and the model's initial weights.
    seed: int = 0
    model: ModelShape = field(default_factory=ModelShape)
    data: DataMix = field(default_factory=DataMix)
    train: TrainSchedule = field(default_factory=TrainSchedule)
    report: ReportEval = field(default_factory=ReportEval)
    teachers: Teachers = field(default_factory=Teachers)
    diffusion: DiffusionLM = field(default_factory=DiffusionLM)
    # Domain models: pyfunc (code/) and chess (chess/).
    code: DomainLM = field(default_factory=DomainLM)
    chess: DomainLM = field(default_factory=DomainLM)
    # The multi-role reasoning model (reasoning/): Countdown in the solve, direct, facts,
    # review and revise roles, for the test-time methods of `es-llm testtime`.
    reasoning: DomainLM = field(default_factory=lambda: DomainLM(
        train=TrainSchedule(steps=1200), tiers=(2, 3, 4)))
    # The knowledge model (knowledge/): a fixed world's facts and questions composing two
    # to four of them, in the solve, direct and facts roles, for CPP in `es-llm testtime`.
    knowledge: DomainLM = field(default_factory=lambda: DomainLM(
        train=TrainSchedule(steps=1200), tiers=(2, 3, 4), rl_per_tier=50))
    # The student converted to sliding-window attention (SWARR's first stage).
    swa: SlidingWindow = field(default_factory=SlidingWindow)

    def __post_init__(self):
        w, n = self.swa, self.model.num_layers
        if w.window > self.model.max_positions:
            raise BadInput(f"swa.window ({w.window}) is larger than the model's context "
                           f"(model.max_positions = {self.model.max_positions}): nothing would "
                           f"slide. Use a window from 1 to {self.model.max_positions}.")
        bad = [i for i in w.layers if not 0 <= i < n]
        if bad or len(set(w.layers)) != len(w.layers):
            raise BadInput(f"swa.layers must be distinct layer indices from 0 to {n - 1} (the "
                           f"student has {n} layers; [] = every layer), got {list(w.layers)}.")

    def fingerprint(self) -> str:
        """A hash of everything that changes the built model: the config (less the report
        settings) and the source of the code that generates data and trains, so a cached
        build is never reused after that code changed."""
        d = to_dict(self)
        d.pop("report")
        d.pop("teachers")
        for part in ("diffusion", "swa", *MODEL_TASKS):
            d.pop(part)
        h = hashlib.sha256(json.dumps(d, sort_keys=True).encode())
        for source in _builder_sources():
            h.update(source.read_bytes())
        return h.hexdigest()[:16]

    def teacher_keys(self) -> dict[str, str]:
        """Cache keys of the stronger teacher and of the weak pair: each hashes its own config
        (and the weak pair its builder's source) on top of the student's fingerprint, whose
        sources include ``train.py``; so changing one never rebuilds the student or the other."""
        keys = {}
        for name in ("strong", "weak"):
            h = hashlib.sha256(json.dumps(to_dict(getattr(self.teachers, name)),
                                          sort_keys=True).encode())
            if name == "weak":
                h.update((Path(__file__).parent / "teachers.py").read_bytes())
            keys[name] = f"{self.size}-{self.fingerprint()}-{name}-{h.hexdigest()[:12]}"
        return keys


    def diffusion_key(self) -> str:
        """Cache key of the diffusion model: its config and builder sources on top of the
        student's fingerprint (whose sources include the data mix it trains on)."""
        h = hashlib.sha256(json.dumps(to_dict(self.diffusion), sort_keys=True).encode())
        pkg = Path(__file__).resolve().parents[1]
        for source in (pkg / "testbed" / "diffusion.py", pkg / "diffusion" / "sampler.py"):
            h.update(source.read_bytes())
        return f"{self.size}-{self.fingerprint()}-diffusion-{h.hexdigest()[:12]}"


    def swa_key(self) -> str:
        """Cache key of the sliding-window conversion: its settings and builder on top of
        the student's fingerprint (whose sources include the training loop it reuses)."""
        h = hashlib.sha256(json.dumps(to_dict(self.swa), sort_keys=True).encode())
        h.update((Path(__file__).parent / "swa.py").read_bytes())
        return f"{self.size}-{self.fingerprint()}-swa-{h.hexdigest()[:12]}"

    def domain_key(self, name: str) -> str:
        """Cache key of a domain model: its config, its task's and example maker's modules
        and the domain builder on top of the student's fingerprint (whose sources include
        the training loop)."""
        h = hashlib.sha256(json.dumps(to_dict(getattr(self, name)), sort_keys=True).encode())
        pkg = Path(__file__).resolve().parents[1]
        examples = pkg / "tasks" / f"{EXAMPLE_MODULES[name].rsplit('.', 1)[1]}.py"
        for source in dict.fromkeys((pkg / "testbed" / "domains.py",
                                     pkg / "tasks" / f"{MODEL_TASKS[name]}.py", examples)):
            h.update(source.read_bytes())
        return f"{self.size}-{self.fingerprint()}-{name}-{h.hexdigest()[:12]}"


def _builder_sources() -> list[Path]:
    pkg = Path(__file__).resolve().parents[1]
    return [pkg / "testbed" / "train.py", pkg / "testbed" / "habits.py",
            pkg / "testbed" / "tokenizer.py",
            pkg / "tasks" / "countdown.py", pkg / "tasks" / "arithmetic.py"]


def preset_path(size: str) -> Path:
    if size not in SIZES:
        raise BadInput(f"unknown testbed size {size!r}; valid sizes are: {', '.join(SIZES)}.")
    return Path(__file__).parent / "presets" / f"{size}.yaml"


def load_testbed_config(size: str = "default", path: str | None = None,
                        overrides: list[str] | None = None) -> TestbedConfig:
    """The preset for ``size``, then an optional YAML file, then ``key=value`` overrides."""
    from es_llm.config import read_yaml
    base = read_yaml(preset_path(size))
    return load_config(TestbedConfig, base=base, path=path, overrides=overrides)
