"""The GRPO-family run config: rollouts, the algorithm's registered parts, the optimizer.

Every variant is a choice of registered names plus scalars here; the trainer never branches on
a method name. Defaults are TRL's GRPO defaults (no KL, clip 0.2, temperature 1.0, group
z-score advantages) with verl's token-mean aggregation; DAPO, GSPO, GAPO, AdaPrefix-GRPO and
replay are switched on by the configs under configs/.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.adapters import LoraSettings
from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from es_llm.runtime import Runtime
from es_llm.tasks import TaskConfig
from gradient.distill.config import DistillSettings
from gradient.maths.adaprefix import PrefixControllerConfig
from gradient.maths.replay import ReplayConfig


def _registry(module: str, function: str):
    """The names of a registry in ``module``, read when asked (the registries import the
    config's neighbours, so not at import time)."""
    def names():
        import importlib
        return getattr(importlib.import_module(module), function)()
    return names


def _is_modes():
    from gradient.maths.rollout_correction import IS_MODES
    return IS_MODES


# The largest float32 (torch.finfo(torch.float32).max), without importing torch here.
FLOAT32_MAX = 3.4028234663852886e38


def _positive(owner: str, obj, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) > 0:
            raise BadInput(f"{owner}.{name} must be > 0, got {getattr(obj, name)!r}.")


@dataclass(frozen=True)
class RolloutSettings:
    # Prompts per optimizer step (P) and rollouts per prompt (G, the group).
    prompts_per_step: int = 16
    group_size: int = 8
    # Sampling temperature of the rollouts; the trainer divides its logits by the same value.
    temperature: float = 1.0
    # Nucleus sampling threshold of the rollouts (1 = off).
    top_p: float = 1.0
    # Longest rollout in tokens.
    max_tokens: int = 64

    def __post_init__(self):
        if self.group_size < 2:
            raise BadInput(f"rollout.group_size must be at least 2 (advantages are relative to "
                           f"the other rollouts of a prompt), got {self.group_size}.")
        _positive("rollout", self, "prompts_per_step", "temperature", "max_tokens")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"rollout.top_p must lie in (0, 1], got {self.top_p}.")


@dataclass(frozen=True)
class KLSettings:
    # Weight of the KL-to-reference term in the loss; 0 loads no reference model.
    coef: float = 0.0
    # Estimator: k1, k2, k3 or k3+ (value k3, gradient of k2).
    estimator: str = choice("k3", _registry("gradient.maths.kl", "kl_names"))
    # Reference model folder; empty = the base model. Its tokenizer must be the policy's.
    ref_model: str = ""

    def __post_init__(self):
        check_choices(self, "algo.kl.")
        if self.coef < 0:
            raise BadInput(f"kl.coef must be >= 0, got {self.coef}.")


@dataclass(frozen=True)
class DynamicSampling:
    # DAPO: drop groups whose rewards are all equal and draw more prompts to refill.
    enabled: bool = False
    # At most this many generation rounds per step (the first included).
    max_gen_batches: int = 4

    def __post_init__(self):
        _positive("dynamic_sampling", self, "max_gen_batches")


@dataclass(frozen=True)
class OverlongShaping:
    # DAPO's soft length penalty over the last buffer_len tokens before max_tokens.
    enabled: bool = False
    buffer_len: int = 16
    penalty_factor: float = 1.0

    def __post_init__(self):
        _positive("overlong", self, "buffer_len")
        if self.penalty_factor < 0:
            raise BadInput(f"overlong.penalty_factor must be >= 0, got {self.penalty_factor}.")


@dataclass(frozen=True)
class ISCorrection:
    # Trainer/engine mismatch correction: none, token_truncate, token_mask, sequence_truncate
    # or sequence_mask (TRL's default, with c_max 3).
    mode: str = choice("sequence_mask", _is_modes)
    c_min: float = 0.0
    c_max: float = 3.0

    def __post_init__(self):
        check_choices(self, "algo.is_correction.")
        if not 0 <= self.c_min < self.c_max:
            raise BadInput(f"is_correction needs 0 <= c_min < c_max, got c_min={self.c_min}, "
                           f"c_max={self.c_max}.")


@dataclass(frozen=True)
class PrefixSettings(PrefixControllerConfig):
    """The controller's own settings (``adaprefix.PrefixControllerConfig``, declared there)
    and whether it is on."""

    # AdaPrefix-GRPO: give each problem a prefix of its reference solution whose length a
    # feedback controller sets to hold the problem's success rate near `target`.
    enabled: bool = False

    def __post_init__(self):
        try:
            super().__post_init__()
        except ValueError as exc:
            raise BadInput(f"algo.prefix: {exc}.") from None


@dataclass(frozen=True)
class ReplaySettings(ReplayConfig):
    """The buffer's own settings (``replay.ReplayConfig``, declared there), whether replay
    is on and how much of it a step trains on."""

    # Rollout-level replay: rollouts keep the advantage and behaviour log-probs of their
    # birth; each step trains on all fresh rollouts plus replay_ratio times as many replayed.
    enabled: bool = False
    replay_ratio: float = 0.5

    def __post_init__(self):
        try:
            super().__post_init__()
        except ValueError as exc:
            raise BadInput(f"algo.replay: {exc}.") from None
        if self.replay_ratio < 0:
            raise BadInput(f"algo.replay.replay_ratio must be >= 0, got {self.replay_ratio}.")


@dataclass(frozen=True)
class RecoveredSettings:
    # LatentRevise's recovered trajectories (recovered.jsonl of `es-llm latent-revise`; empty
    # = off): a training group whose G rollouts all fail gets its problem's verified
    # trajectory as one extra, off-policy row (gradient/loop/birth_stages.py, recovered_rows).
    data: str = ""


@dataclass(frozen=True)
class DiffusionRLSettings:
    # How a rollout's log-probability is estimated (gradient/dllm/estimators.py):
    # autoregressive (causal LMs: exact), or for masked-diffusion LMs mean_field (d1 /
    # diffu-GRPO), trace (TraceRL), quadrature (SLIM-RL), student_view (dOPSD's student).
    estimator: str = choice("autoregressive", _registry("gradient.dllm.estimators",
                                                        "estimator_names"))
    # mean_field: probability of masking each prompt token (d1's train.yaml: 0.15).
    p_mask_prompt: float = 0.15
    # trace: merge every `shrink` consecutive commit steps of a block into one row.
    shrink: int = 1
    # quadrature: Gauss-Legendre levels per rollout and the cap of the per-block spread.
    quadrature_points: int = 3
    spread_cap: float = 0.2

    def __post_init__(self):
        check_choices(self, "algo.dllm.")
        if not 0 <= self.p_mask_prompt < 1:
            raise BadInput(f"algo.dllm.p_mask_prompt must lie in [0, 1), got {self.p_mask_prompt}.")
        if self.shrink < 1 or self.quadrature_points < 1:
            raise BadInput("algo.dllm.shrink and algo.dllm.quadrature_points must be >= 1.")
        if not 0 < self.spread_cap < 1:
            raise BadInput(f"algo.dllm.spread_cap must lie in (0, 1), got {self.spread_cap}.")


@dataclass(frozen=True)
class AlgoSettings:
    # Advantage estimator: grpo (group z-score), dr_grpo (no std) or rloo.
    advantage: str = choice("grpo", _registry("gradient.maths.advantages", "advantage_names"))
    # grpo's std: unbiased (Bessel, as TRL and verl) or population, and the eps added to it.
    unbiased_std: bool = True
    std_eps: float = 1e-6
    # Policy loss: ppo_clip (token ratio), gspo (sequence ratio) or gapo.
    loss: str = choice("ppo_clip", _registry("gradient.maths.losses", "loss_names"))
    # Clip range [1 - clip_low, 1 + clip_high]; clip_high > clip_low is DAPO's clip-higher.
    clip_low: float = 0.2
    clip_high: float = 0.2
    # Dual clip c (> 1) bounds the loss of negative-advantage tokens; null = off.
    dual_clip: float | None = None
    # GAPO: the upper clip bound of a correct rollout grows to this as fewer rollouts succeed.
    gapo_clip_high_max: float = 0.005
    # Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum or
    # seq-mean-token-sum-norm (Dr. GRPO's constant: max_tokens per sequence).
    aggregation: str = choice("token-mean", _registry("gradient.maths.aggregation",
                                                      "aggregation_names"))
    # Entropy bonus weight (0 = off; the entropy is always logged).
    entropy_coef: float = 0.0
    # Passes over each batch and mini-batches per pass (optimizer steps per batch).
    epochs: int = 1
    mini_batches: int = 1
    kl: KLSettings = field(default_factory=KLSettings)
    dynamic_sampling: DynamicSampling = field(default_factory=DynamicSampling)
    overlong: OverlongShaping = field(default_factory=OverlongShaping)
    is_correction: ISCorrection = field(default_factory=ISCorrection)
    prefix: PrefixSettings = field(default_factory=PrefixSettings)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    distill: DistillSettings = field(default_factory=DistillSettings)
    dllm: DiffusionRLSettings = field(default_factory=DiffusionRLSettings)
    recovered: RecoveredSettings = field(default_factory=RecoveredSettings)

    def __post_init__(self):
        check_choices(self, "algo.")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise BadInput(f"the clip range needs 0 <= clip_low < 1 and clip_high >= 0, got "
                           f"clip_low={self.clip_low}, clip_high={self.clip_high}.")
        if self.clip_low > self.clip_high and self.loss != "gapo":
            raise BadInput(f"clip_low ({self.clip_low}) > clip_high ({self.clip_high}): the "
                           f"clip range must not be narrower above 1 than below (DAPO's "
                           f"clip-higher makes clip_high the larger one).")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise BadInput(f"algo.dual_clip must be > 1 (or null), got {self.dual_clip}.")
        if self.std_eps < 0 or self.entropy_coef < 0:
            raise BadInput("algo.std_eps and algo.entropy_coef must be >= 0.")
        _positive("algo", self, "epochs", "mini_batches")
        self._check_diffusion()
        self._check_recovered()
        if self.distill.drift.enabled and not (self.epochs > 1 or self.mini_batches > 1
                                               or self.replay.enabled):
            raise BadInput("algo.distill.drift gates reused rollouts, but every rollout is used "
                           "once here (all gates would be 1): set algo.epochs > 1, "
                           "algo.mini_batches > 1 or algo.replay.enabled.")


    def _check_recovered(self) -> None:
        from gradient.dllm.estimators import estimator_spec
        if not self.recovered.data:
            return
        clash = [name for name, on in (
            ("algo.dynamic_sampling", self.dynamic_sampling.enabled),
            ("algo.prefix", self.prefix.enabled),
            ("algo.distill", self.distill.method != "none"),
            ("algo.loss=gapo", self.loss == "gapo"),
            (f"algo.dllm.estimator={self.dllm.estimator}",
             estimator_spec(self.dllm.estimator).diffusion)) if on]
        if clash:
            raise BadInput(f"algo.recovered adds a row to groups whose rollouts all failed, "
                           f"which {', '.join(clash)} would not keep as sampled (dynamic "
                           f"sampling drops those groups, prefixes change the prompt, "
                           f"GAPO's clip width is set from the group before the row joins it, "
                           f"distillation and diffusion estimators score rows of their own); "
                           f"turn them off or leave algo.recovered.data empty.")

    def _check_diffusion(self) -> None:
        from gradient.dllm.estimators import estimator_spec
        name = self.dllm.estimator
        if (name == "student_view") != (self.distill.method == "dopsd"):
            raise BadInput("algo.dllm.estimator='student_view' and algo.distill.method='dopsd' "
                           "go together: dOPSD's student view is that estimator, and the "
                           f"estimator only makes sense with it (got estimator {name!r}, "
                           f"method {self.distill.method!r}).")
        if not estimator_spec(name).diffusion:
            return
        if self.distill.method not in ("none", "dopsd"):
            raise BadInput(f"algo.distill.method={self.distill.method!r} scores rollouts "
                           f"with an autoregressive teacher; with a diffusion estimator "
                           f"({name!r}) only dopsd (or none) is available.")
        off = [n for n, on in (("algo.prefix", self.prefix.enabled),
                               ("algo.replay", self.replay.enabled),
                               ("algo.distill.drift", self.distill.drift.enabled)) if on]
        if off or self.is_correction.mode != "none":
            raise BadInput(f"the diffusion estimator {name!r} supports neither prefixes, "
                           f"replay, drift gates nor trainer/engine correction (its sampler "
                           f"reports no log-probs); turn off {', '.join(off) or 'nothing else'} "
                           f"and set algo.is_correction.mode=none.")


@dataclass(frozen=True)
class OptimSettings:
    # AdamW on every parameter of the policy.
    lr: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    # Clip the gradient's global norm to this (0 = off).
    grad_clip: float = 1.0
    # Linear warmup of the learning rate over this many steps (0 = none). Adam's first
    # updates move every weight by about lr whatever its gradient; the post-LN encoders of
    # the diffusion testbed lost their reward within a step without it.
    warmup_steps: int = 0

    def __post_init__(self):
        _positive("optim", self, "lr")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise BadInput(f"optim.beta1 and optim.beta2 must lie in [0, 1) (AdamW's moment "
                           f"decays), got {self.beta1!r} and {self.beta2!r}.")
        # AdamW's first step is lr / (1 - beta1) times a unit-size direction; torch refuses
        # a step size beyond the float32 range outright.
        if self.lr / (1 - self.beta1) >= FLOAT32_MAX:
            raise BadInput(f"optim.lr={self.lr:g} makes AdamW's first step size lr / (1 - "
                           f"beta1) overflow float32 (largest {FLOAT32_MAX:.4g}); give a "
                           f"learning rate below {FLOAT32_MAX * (1 - self.beta1):.4g}.")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise BadInput("optim.grad_clip, optim.weight_decay and optim.warmup_steps must "
                           "be >= 0.")

    def adamw(self, params):
        """The AdamW these settings describe, over ``params``."""
        import torch
        return torch.optim.AdamW(params, lr=self.lr, betas=(self.beta1, self.beta2),
                                 weight_decay=self.weight_decay)

    def advice(self) -> str:
        """What to change when a run under these settings diverged."""
        return (f"Lower optim.lr (now {self.lr:g})"
                + ("" if self.grad_clip else ", set optim.grad_clip (now 0, off)")
                + ("" if self.warmup_steps else " or warm it up (optim.warmup_steps)"))

    def set_lr(self, optimizer, step: int) -> None:
        """The learning rate of optimizer step ``step`` (0-based) after the linear warmup: a
        function of the step alone, so a resumed run needs no scheduler state."""
        for group in optimizer.param_groups:
            group["lr"] = (self.lr * min(1.0, (step + 1) / self.warmup_steps)
                           if self.warmup_steps else self.lr)


@dataclass(frozen=True)
class GRPORunConfig:
    # The policy's starting point: a Hugging Face folder (e.g. from `es-llm testbed`).
    model: str = ""
    # Training prompts; a testbed model brings data/<task>_rl.jsonl, used when data is null.
    task: TaskConfig = field(default_factory=TaskConfig)
    # Rollout engine: auto (vLLM when installed), hf (the policy itself) or vllm.
    backend: str = choice("auto", lambda: ("auto", "hf", "vllm"))
    # Optimizer steps of the whole run (each on one step's rollouts).
    steps: int = 100
    # The run seed: prompt batches, sampling streams, shuffles.
    seed: int = 0
    # Save an HF checkpoint (plus optimizer and trainer state) every this many steps.
    checkpoint_every: int = 20
    # Rows per forward/backward pass; the loss is the same for any value (global counts).
    micro_batch: int = 64
    # Device, precision (float32 master weights and optimizer state, compute in
    # runtime.dtype), context, engine memory and gradient checkpointing of the policy, its
    # rollout engine, the reference and the teachers.
    runtime: Runtime = field(default_factory=Runtime)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    algo: AlgoSettings = field(default_factory=AlgoSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    # Train a LoRA adapter (PEFT) instead of every weight: the optimizer sees the adapter
    # only, checkpoints hold the merged model plus adapter/ (causal LMs only).
    lora: LoraSettings = field(default_factory=LoraSettings)

    def __post_init__(self):
        check_choices(self)
        for name in ("steps", "checkpoint_every", "micro_batch"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.lora.enabled and self.lora.dropout > 0:
            raise BadInput(f"lora.dropout={self.lora.dropout} would make the trainer's "
                           f"log-probs differ from the sampler's at every token (the policy "
                           f"is scored without dropout, as it samples); set lora.dropout=0 "
                           f"(SFT is where it applies).")
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        if batch % self.algo.mini_batches:
            raise BadInput(f"algo.mini_batches ({self.algo.mini_batches}) must divide the "
                           f"rollouts per step (prompts_per_step x group_size = {batch}).")
