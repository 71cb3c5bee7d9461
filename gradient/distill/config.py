"""``algo.distill``: which distillation method runs, its models and its knobs.

Defaults are the papers' where they give one; each shipped ``configs/opd_*`` file says where it
departs for the testbed's scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from es_llm.config import check_choices, choice
from es_llm.errors import BadInput


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise BadInput(message)


@dataclass(frozen=True)
class GJSDSettings:
    # Generalized JSD (GKD): beta 0 = forward KL(T||S), 1 = reverse KL(S||T), between = JSD.
    beta: float = 0.5
    # Sum over the teacher's top_k tokens (null = the whole vocabulary), with one extra
    # category holding the rest of each distribution's mass when tail_bucket is true.
    top_k: int | None = None
    tail_bucket: bool = True

    def __post_init__(self):
        _check(0 <= self.beta <= 1, f"algo.distill.gjsd.beta must lie in [0, 1], got {self.beta}.")
        _check(self.top_k is None or self.top_k >= 1,
               f"algo.distill.gjsd.top_k must be null or >= 1, got {self.top_k}.")


@dataclass(frozen=True)
class W2SSettings:
    # The contrast pair: the stronger and the weaker weak model (same tokenizer), e.g. a small
    # model after and before a short RL run (the testbed's teachers/weak_rl and weak_base).
    positive: str = ""
    negative: str = ""
    # Proxy teacher logits = base + alpha * (positive - negative); base = the initial student.
    alpha: float = 1.0
    # Reverse KL over the proxy's top_k tokens (null = the whole vocabulary).
    top_k: int | None = 32

    def __post_init__(self):
        _check(self.top_k is None or self.top_k >= 1,
               f"algo.distill.w2s.top_k must be null or >= 1, got {self.top_k}.")


@dataclass(frozen=True)
class RSTGSettings:
    # The hybrid advantage's beta, annealed linearly: max(beta_init - beta_decay * step,
    # beta_floor) (paper: 5e-3, 5e-5, 1e-3); the same beta weighs the SFT term.
    beta_init: float = 5e-3
    beta_decay: float = 5e-5
    beta_floor: float = 1e-3
    # OPD applies to the top token_frac of each failed rollout's tokens by the soft-OR score.
    token_frac: float = 0.2
    # The teacher's solve rate on a prompt (its confidence) from this many samples (mean@8).
    teacher_samples: int = 8
    # Weight of the SFT term on the teacher's shortest correct trajectory (0 = off).
    sft_coef: float = 1.0

    def __post_init__(self):
        _check(0 <= self.token_frac <= 1,
               f"algo.distill.rstg.token_frac must lie in [0, 1], got {self.token_frac}.")
        _check(self.teacher_samples >= 1, "algo.distill.rstg.teacher_samples must be >= 1.")
        _check(min(self.beta_init, self.beta_decay, self.beta_floor, self.sft_coef) >= 0,
               "algo.distill.rstg: beta_init, beta_decay, beta_floor and sft_coef must be >= 0.")


@dataclass(frozen=True)
class DEARSettings:
    # Decisions: the top q of each rollout's tokens by student entropy; evidence: the top r of
    # the rest by anchor similarity boosted by (1 + boost * divergence).
    q: float = 0.2
    r: float = 0.2
    boost: float = 1.0
    # OPD token weights on decisions, evidence and the other tokens (normalised to mean 1).
    w_decision: float = 1.0
    w_evidence: float = 1.0
    w_other: float = 0.1
    # The student layer whose hidden states give the similarities (-1 = the last).
    layer: int = -1
    # Only anchors at most this many tokens away count (null = any).
    window: int | None = None

    def __post_init__(self):
        _check(0 <= self.q <= 1 and 0 <= self.r <= 1,
               f"algo.distill.dear.q and .r must lie in [0, 1], got {self.q}, {self.r}.")
        _check(min(self.boost, self.w_decision, self.w_evidence, self.w_other) >= 0,
               "algo.distill.dear: boost and the weights must be >= 0.")
        _check(self.window is None or self.window >= 1, "algo.distill.dear.window must be >= 1.")


AVSD_VIEWS = ("full", "partial", "answer")


@dataclass(frozen=True)
class AVSDSettings:
    # Privileged views the self-teacher sees in its prompt: the full reference solution, its
    # first half, or only the final answer.
    views: tuple[str, ...] = AVSD_VIEWS
    # Candidate support: the union of each view's top_k tokens and the sampled token.
    top_k: int = 8
    # Teacher weights: the initial student's, frozen (false), or the live student's under
    # stop-gradient (true, as in the paper).
    live: bool = False

    def __post_init__(self):
        bad = [v for v in self.views if v not in AVSD_VIEWS]
        _check(bool(self.views) and not bad,
               f"algo.distill.avsd.views must be a non-empty list of {', '.join(AVSD_VIEWS)}; "
               f"got {list(self.views)}.")
        _check(self.top_k >= 1, f"algo.distill.avsd.top_k must be >= 1, got {self.top_k}.")


@dataclass(frozen=True)
class DriftSettings:
    # Blockwise policy-drift gates on the distillation token losses under rollout reuse
    # (epochs > 1, mini_batches > 1 or replay): g = exp(-tau |mean block log-prob shift|).
    enabled: bool = False
    block_size: int = 64
    tau: float = 1.0

    def __post_init__(self):
        _check(self.block_size >= 1 and self.tau >= 0,
               "algo.distill.drift needs block_size >= 1 and tau >= 0.")


def _method_names() -> list[str]:
    from gradient.distill.methods import distill_method_names
    return distill_method_names()


DOPSD_TEACHER_VIEWS = ("snapshot", "final", "all_future")
DOPSD_STEP_SELECT = ("random", "most", "least")


@dataclass(frozen=True)
class DOPSDSettings:
    # The teacher's view of the student's trajectory: `gap` steps after the student's state
    # (snapshot), the final canvas (final), or the mean over every later state (all_future).
    teacher_view: str = choice("snapshot", lambda: DOPSD_TEACHER_VIEWS)
    gap: int = 4
    # The student's state: one whose masked fraction of the completion exceeds the
    # threshold, the most masked, the least masked or a random one (seeded per rollout).
    mask_threshold: float = 0.3
    step_select: str = choice("random", lambda: DOPSD_STEP_SELECT)
    # Teacher weights: the initial model's, frozen (true, the paper's main setting), or the
    # live model's under stop-gradient.
    fixed_teacher: bool = True
    # Drop rollouts the verifier judges wrong (the loss is then 0 on them).
    filter_wrong: bool = False
    # Generalized JSD: 0 = forward KL(teacher || student), the stable default; 1 = reverse.
    beta: float = 0.0

    def __post_init__(self):
        check_choices(self, "algo.distill.dopsd.")
        _check(self.gap >= 1, f"algo.distill.dopsd.gap must be >= 1, got {self.gap}.")
        _check(0 <= self.mask_threshold < 1 and 0 <= self.beta <= 1,
               "algo.distill.dopsd needs mask_threshold in [0, 1) and beta in [0, 1].")


@dataclass(frozen=True)
class DistillSettings:
    # On-policy distillation method (none = plain GRPO): opd, ra_opd, rstg, dear, avsd (per-
    # token advantages on the sampled tokens), gjsd or w2s (full-distribution divergences),
    # dopsd (diffusion LMs: self-distillation from a later state of the same trajectory).
    method: str = choice("none", lambda: ["none", *_method_names()])
    # The teacher: a Hugging Face folder whose tokenizer is the student's (opd, ra_opd, rstg,
    # dear, gjsd); avsd's teacher is the student itself, w2s's the proxy of w2s.*.
    teacher: str = ""
    # Advantage = reward_coef * (group-centred task reward) + kl_coef * distillation advantage;
    # divergence methods add kl_coef * divergence to the loss.
    kl_coef: float = 1.0
    reward_coef: float = 0.0
    gjsd: GJSDSettings = field(default_factory=GJSDSettings)
    w2s: W2SSettings = field(default_factory=W2SSettings)
    rstg: RSTGSettings = field(default_factory=RSTGSettings)
    dear: DEARSettings = field(default_factory=DEARSettings)
    avsd: AVSDSettings = field(default_factory=AVSDSettings)
    drift: DriftSettings = field(default_factory=DriftSettings)
    dopsd: DOPSDSettings = field(default_factory=DOPSDSettings)

    def __post_init__(self):
        from gradient.distill.methods import method_spec
        check_choices(self, "algo.distill.")
        _check(self.kl_coef >= 0 and self.reward_coef >= 0,
               "algo.distill.kl_coef and algo.distill.reward_coef must be >= 0.")
        if self.method == "none":
            return
        spec = method_spec(self.method)
        if "teacher" in spec.models:
            _check(bool(self.teacher), f"algo.distill.method={self.method!r} needs a teacher "
                                       f"model: set algo.distill.teacher to a Hugging Face "
                                       f"folder with the student's tokenizer.")
        if "positive" in spec.models:
            _check(bool(self.w2s.positive and self.w2s.negative),
                   "algo.distill.method='w2s' needs its contrast pair: set "
                   "algo.distill.w2s.positive and algo.distill.w2s.negative to Hugging Face "
                   "folders with the student's tokenizer (e.g. a testbed's teachers/weak_rl "
                   "and teachers/weak_base).")
