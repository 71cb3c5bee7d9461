"""The ES run's config: the ES maths' settings (``es``: ``populations.es.ESConfig`` itself),
what evolves and how members are served (``engine``, or a LoRA adapter: ``lora``), and what
the run trains on."""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.adapters import LoraSettings
from es_llm.backends import BACKEND_NAMES
from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from es_llm.es.weights import PARAMETER_FILTERS
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig
from populations.es import ESConfig

SERVE_MODES = ("weights", "rows")


@dataclass(frozen=True)
class EngineSettings:
    """How the engine puts the population onto a model: which of its parameters evolve and
    how members are served and scored (the ES maths' own settings are ``ESRunConfig.es``)."""

    # Which parameters evolve: all, matrices (ndim >= 2) or regex (names matching param_pattern).
    params: str = choice("all", lambda: PARAMETER_FILTERS)
    # With params=regex: a regular expression searched in each parameter's name.
    param_pattern: str = ""
    # How members are served: weights (each member's weights written, then generated; any
    # backend) or rows (es.kind=lowrank or lora.enabled, HF backend: many members in one
    # batched generate call, each row adding its member's low-rank term, no weight written).
    serve: str = choice("weights", lambda: SERVE_MODES)
    # Prompts each member (each antithetic pair) is scored on, taken from the iteration's
    # batch; 0 = every member on the whole batch.
    prompts_per_member: int = 0
    # With serve=rows: members evaluated in one generate call (bounds memory; even when
    # es.antithetic, so a pair shares one factor draw).
    members_per_call: int = 64

    def __post_init__(self):
        check_choices(self, "engine.")
        if self.prompts_per_member < 0:
            raise BadInput(f"engine.prompts_per_member must be >= 0 (0 = the whole batch), "
                           f"got {self.prompts_per_member}.")
        if self.members_per_call < 1:
            raise BadInput(f"engine.members_per_call must be at least 1, got "
                           f"{self.members_per_call}.")


@dataclass(frozen=True)
class ESRunConfig:
    # The base model: a Hugging Face folder (e.g. from `es-llm testbed`).
    model: str = ""
    # Training prompts; a testbed model brings data/<task>_rl.jsonl, used when data is null.
    task: TaskConfig = field(default_factory=TaskConfig)
    es: ESConfig = field(default_factory=ESConfig)
    engine: EngineSettings = field(default_factory=EngineSettings)
    # Evolve a LoRA adapter instead of the weights (lora.enabled): the factors A (r, in) and
    # B (out, r) of each target layer get full-rank noise (es.sigma on both; B starts at 0,
    # so early members differ through B), and members are served as W + (alpha/r) B A. Not
    # es.kind=lowrank (EGGROLL), which adds low-rank noise to the full matrices.
    lora: LoraSettings = field(default_factory=LoraSettings)
    # ES iterations (population evaluations and updates) of the whole run.
    iterations: int = 100
    # Prompts per iteration; every member is scored on this batch (greedy decoding), or on
    # engine.prompts_per_member of it.
    prompts_per_iteration: int = 64
    # Longest completion of a member, in tokens.
    max_tokens: int = 64
    # The run seed: noise keys, prompt batches.
    seed: int = 0
    # Save a checkpoint every this many iterations (and at the end).
    checkpoint_every: int = 20
    # Compare a checksum of the weights across ranks every this many iterations.
    checksum_every: int = 5
    # Generation backend of the population: auto (vLLM when installed), hf or vllm.
    backend: str = choice("auto", lambda: BACKEND_NAMES)
    # Device, dtype (of the served population; the master copy is always float32), context
    # and engine memory.
    runtime: Runtime = field(default_factory=Runtime)
    # Under MPI: the longest a rank waits in an exchange for another rank (whose evaluation
    # of its members is part of the wait) before the job is ended, naming the silent rank.
    comm_timeout_s: float = 300.0
    # Pin each rank to its own share of its node's cores (from its local rank); false lets
    # the OS place every rank's threads anywhere.
    bind_cores: bool = True

    def __post_init__(self):
        check_choices(self)
        for name in ("iterations", "prompts_per_iteration", "max_tokens", "checkpoint_every",
                     "checksum_every"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.engine.prompts_per_member > self.prompts_per_iteration:
            raise BadInput(f"engine.prompts_per_member={self.engine.prompts_per_member} does "
                           f"not fit the batch of prompts_per_iteration="
                           f"{self.prompts_per_iteration}; choose at most "
                           f"{self.prompts_per_iteration} (0 = the whole batch).")
        self._check_engine()
        if not self.comm_timeout_s > 0:
            raise BadInput(f"comm_timeout_s must be > 0 seconds, got {self.comm_timeout_s}.")

    def _check_engine(self) -> None:
        """The engine's serving mode against the population's settings."""
        if self.es.algorithm != "es" and (self.es.kind != "full" or self.engine.serve != "weights"):
            raise BadInput(f"es.algorithm={self.es.algorithm} samples explicit members (evotorch "
                           f"holds the population), written as weights: set es.kind=full and "
                           f"engine.serve=weights (got es.kind={self.es.kind}, engine.serve="
                           f"{self.engine.serve}); low-rank and row-served populations are "
                           f"es.algorithm=es.")
        if self.lora.enabled:
            # An adapter member is low-rank by construction, so rows can serve it.
            self._check_lora()
        elif self.engine.serve == "rows" and self.es.kind != "lowrank":
            raise BadInput("engine.serve=rows needs es.kind=lowrank or lora.enabled (full-rank "
                           "members cannot be added per row); use engine.serve=weights.")
        elif self.engine.serve == "rows" and self.es.vectors == "full":
            raise BadInput("engine.serve=rows perturbs matrices only; set es.vectors=frozen or "
                           "engine.serve=weights.")
        if self.es.antithetic and self.engine.members_per_call % 2:
            raise BadInput(f"engine.members_per_call must be even with es.antithetic=true (a "
                           f"mirrored pair shares one call), got {self.engine.members_per_call}.")

    def _check_lora(self) -> None:
        """An adapter run against the settings it replaces or cannot combine with."""
        if self.es.kind == "lowrank":
            raise BadInput("lora.enabled evolves a LoRA adapter's factors with full-rank noise "
                           "on A and B, while es.kind=lowrank is EGGROLL: rank-r noise on the "
                           "model's full matrices. They are two different populations; choose "
                           "es.kind=full with lora.enabled, or lora.enabled=false for EGGROLL.")
        if self.engine.params != "all" or self.engine.param_pattern:
            raise BadInput(f"with lora.enabled the adapter decides what evolves (its factors "
                           f"on lora.target_modules), so engine.params={self.engine.params} "
                           f"engine.param_pattern={self.engine.param_pattern!r} has no "
                           f"meaning; leave engine.params=all and engine.param_pattern empty, "
                           f"and choose layers with lora.target_modules.")

    def samples_per_iteration(self) -> int:
        """Greedy rollouts one iteration generates: every member on each of its prompts (the
        engine's samples/generated grows by this much per iteration)."""
        return self.es.population * (self.engine.prompts_per_member
                                     or self.prompts_per_iteration)
