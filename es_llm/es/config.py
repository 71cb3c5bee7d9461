"""The ES run's config: what evolves, how the population is shaped and stepped, on what."""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from es_llm.es.weights import PARAMETER_FILTERS
from es_llm.tasks import TaskConfig
from populations.noise import NOISE_DEVICES
from populations.optimizers import optimizer_names
from populations.perturbations import VECTOR_MODES, kind_names
from populations.shaping import shaping_names

SERVE_MODES = ("weights", "rows")


@dataclass(frozen=True)
class ESSettings:
    # Population size N (members per iteration); even when antithetic.
    population: int = 30
    # Noise scale: a member's weights are master + sigma * eps.
    sigma: float = 1e-3
    # Step size alpha of the update (the 1/sigma of the textbook estimator is folded in,
    # as in Qiu et al. 2025: theta += alpha / N * sum_n z_n eps_n).
    lr: float = 5e-4
    # Mirrored pairs (eps, -eps) share one noise draw.
    antithetic: bool = False
    # Fitness shaping: zscore, centered_rank, group_zscore, pair_diff (antithetic) or raw.
    shaping: str = choice("zscore", shaping_names)
    # Optimizer on the estimate: sgd or adam.
    optimizer: str = choice("sgd", optimizer_names)
    # Weight decay toward the initial weights (0 = off).
    anchor_decay: float = 0.0
    # Which parameters evolve: all, matrices (ndim >= 2) or regex (names matching param_pattern).
    params: str = choice("all", lambda: PARAMETER_FILTERS)
    # With params=regex: a regular expression searched in each parameter's name.
    param_pattern: str = ""
    # Where noise is drawn: cpu (the same values on every machine) or cuda (much faster on a
    # GPU, but different values, so a run's ledger then replays only on CUDA machines).
    noise_device: str = choice("cpu", lambda: NOISE_DEVICES)
    # Perturbation: full (i.i.d. noise on every evolving tensor) or lowrank (rank-r noise
    # A B^T / sqrt(r) on matrices, EGGROLL).
    kind: str = choice("full", kind_names)
    # Rank r of each matrix's perturbation with kind=lowrank (at most min(out, in)).
    rank: int = 1
    # With kind=lowrank, non-matrix parameters (norm weights, biases): frozen or full noise.
    vectors: str = choice("frozen", lambda: VECTOR_MODES)
    # How members are served: weights (each member's weights written, then generated; any
    # backend) or rows (kind=lowrank, HF backend: many members in one batched generate call,
    # each row adding its member's low-rank term, no weight written).
    serve: str = choice("weights", lambda: SERVE_MODES)
    # Prompts each member (each antithetic pair) is scored on, taken from the iteration's
    # batch; 0 = every member on the whole batch.
    prompts_per_member: int = 0
    # With serve=rows: members evaluated in one generate call (bounds memory; even when
    # antithetic, so a pair shares one factor draw).
    members_per_call: int = 64

    def __post_init__(self):
        if self.population < 2:
            raise BadInput(f"es.population must be at least 2, got {self.population}.")
        if self.antithetic and self.population % 2:
            raise BadInput(f"es.population must be even with es.antithetic=true (members come "
                           f"in mirrored pairs), got {self.population}.")
        if not self.sigma > 0:
            raise BadInput(f"es.sigma must be > 0, got {self.sigma}.")
        if not self.lr > 0:
            raise BadInput(f"es.lr must be > 0, got {self.lr}.")
        check_choices(self, "es.")
        if self.rank < 1:
            raise BadInput(f"es.rank must be at least 1, got {self.rank}.")
        if self.serve == "rows" and self.kind != "lowrank":
            raise BadInput("es.serve=rows needs es.kind=lowrank (full-rank members cannot be "
                           "added per row); use es.serve=weights.")
        if self.serve == "rows" and self.vectors == "full":
            raise BadInput("es.serve=rows perturbs matrices only; set es.vectors=frozen or "
                           "es.serve=weights.")
        if self.shaping == "pair_diff" and not self.antithetic:
            raise BadInput("es.shaping=pair_diff needs es.antithetic=true.")
        if self.prompts_per_member < 0:
            raise BadInput(f"es.prompts_per_member must be >= 0 (0 = the whole batch), got "
                           f"{self.prompts_per_member}.")
        if self.members_per_call < 1 or (self.antithetic and self.members_per_call % 2):
            raise BadInput(f"es.members_per_call must be a positive even number with "
                           f"es.antithetic=true (a positive number otherwise), got "
                           f"{self.members_per_call}.")
        if self.noise_device == "cuda":
            from populations.noise import check_noise_device
            try:
                check_noise_device(self.noise_device)
            except ValueError as exc:
                raise BadInput(f"es.noise_device: {exc}.") from None


@dataclass(frozen=True)
class ESRunConfig:
    # The base model: a Hugging Face folder (e.g. from `es-llm testbed`).
    model: str = ""
    # Training prompts; a testbed model brings data/<task>_rl.jsonl, used when data is null.
    task: TaskConfig = field(default_factory=TaskConfig)
    es: ESSettings = field(default_factory=ESSettings)
    # ES iterations (population evaluations and updates) of the whole run.
    iterations: int = 100
    # Prompts per iteration; every member is scored on this batch (greedy decoding), or on
    # es.prompts_per_member of it.
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
    backend: str = choice("auto", lambda: ("auto", "hf", "vllm"))
    # Device of the served model and of the fp32 master copy: cpu or cuda.
    device: str = choice("cpu", lambda: ("cpu", "cuda"))
    # Dtype of the served model (the master copy is always float32): float32, bfloat16, float16.
    dtype: str = choice("float32", lambda: ("float32", "bfloat16", "float16"))
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
        if self.es.prompts_per_member > self.prompts_per_iteration:
            raise BadInput(f"es.prompts_per_member={self.es.prompts_per_member} does not fit "
                           f"the batch of prompts_per_iteration={self.prompts_per_iteration}; "
                           f"choose at most {self.prompts_per_iteration} (0 = the whole batch).")
        if not self.comm_timeout_s > 0:
            raise BadInput(f"comm_timeout_s must be > 0 seconds, got {self.comm_timeout_s}.")

    def samples_per_iteration(self) -> int:
        """Greedy rollouts one iteration generates: every member on each of its prompts (the
        engine's samples/generated grows by this much per iteration)."""
        return self.es.population * (self.es.prompts_per_member or self.prompts_per_iteration)
