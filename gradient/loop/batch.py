"""The typed rollouts every gradient method works on.

A ``Rollout`` is one completion the policy is trained on (sampled by the engine, or given, as
RSTG's teacher trajectories): its token ids, what the sampler and the verifier said of it,
and the fields birth stages attach (``gradient.loop.birth_stages``). It is frozen: a stage
returns new rollouts with ``dataclasses.replace``, so a rollout kept in the replay buffer
cannot be changed behind its back. A ``RolloutBatch`` is an ordered tuple of them, and ``padded``
collates one micro-batch into the ``_B_T`` tensors the loss terms read, once.

Per-token fields are stored as float lists of the completion's length (not tensors): a batch
mixes lengths, rollouts outlive their micro-batch (replay), and the lists are what the saved
trainer state holds. Advantages are float64 values (from float64 rewards) collated to float32.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator, Sequence

import torch

from gradient.loop.seeds import derive_seed
from gradient.maths.logprobs import pad_rows
from gradient.maths.losses import token_advantages


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    # The generated tokens (for a diffusion sampler the canvas up to its first EOS).
    completion_ids: list[int]
    # The sampler's log-probs of the generated tokens; None when the sampler reports none (a
    # diffusion sampler) or the rollout was not sampled (an SFT row).
    engine_logp: list[float] | None
    reward: float
    correct: bool
    problem: object
    # Index of the rollout's prompt group within its step.
    group: int
    # Seed of the rollout's log-prob masks (diffusion estimators).
    mask_seed: int = 0
    # What a diffusion sampler saw (DiffusionTrace); None for autoregressive rollouts.
    trace: object = None
    # The advantage: one value for the whole sequence (the configured estimator's, from the
    # task reward), or one per generated token (distillation transforms, SFT rows).
    adv: float | list[float] = 0.0
    # GAPO's upper clip width of this rollout's group.
    clip_high: float | None = None
    # Frozen at birth, before any update: the trainer's log-probs (one list per inner
    # iteration in ``old_views`` for estimators whose masks change with it), the mismatch
    # weight against the sampler, and the reference model's log-probs.
    old_logp: list[float] | None = None
    is_weight: list[float] | None = None
    old_views: tuple[list[float], ...] | None = None
    ref_logp: list[float] | None = None
    ref_views: tuple[list[float], ...] | None = None
    # SLIM-RL quadrature: the Gauss-Legendre level of this row and its weight ``K w_j``.
    level: int | None = None
    row_weight: float | None = None

    def old(self, view: int) -> list[float] | None:
        return self.old_views[view] if self.old_views else self.old_logp

    def ref(self, view: int) -> list[float] | None:
        return self.ref_views[view] if self.ref_views else self.ref_logp

    def per_token(self) -> bool:
        """Whether the advantage is one value per token rather than one for the sequence."""
        return isinstance(self.adv, list)

    def mean_adv(self) -> float:
        """The advantage as one number: the sequence's, or the mean over the tokens."""
        return sum(self.adv) / max(len(self.adv), 1) if self.per_token() else self.adv

    @staticmethod
    def from_saved(payload) -> "Rollout":
        """A rollout from a trainer state, as saved by any version: older states hold field
        dicts, and before the advantage was one field its per-token values were
        ``adv_tokens``; fields no longer declared are dropped."""
        saved = dict(vars(payload) if isinstance(payload, Rollout) else payload)
        if saved.get("adv_tokens") is not None:
            saved["adv"] = saved["adv_tokens"]
        known = {f.name for f in fields(Rollout)}
        return Rollout(**{k: v for k, v in saved.items() if k in known})


@dataclass(frozen=True)
class PaddedBatch:
    """One micro-batch of B rollouts padded to T tokens (the policy estimate's T)."""

    # None when the behaviour log-probs were not frozen (the ratio is then 1).
    old_logp_B_T: torch.Tensor | None
    is_weight_B_T: torch.Tensor | None
    ref_logp_B_T: torch.Tensor | None
    # The advantage of each token: a sequence's is broadcast along its row (what it holds
    # where the estimate's mask is 0 is never read).
    adv_B_T: torch.Tensor
    # GAPO's per-row upper clip widths (float64), quadrature's row weights.
    clip_high_B: torch.Tensor | None
    row_weight_B: torch.Tensor | None


@dataclass(frozen=True)
class RolloutBatch:
    rollouts: tuple[Rollout, ...] = ()

    def __len__(self) -> int:
        return len(self.rollouts)

    def __iter__(self) -> Iterator[Rollout]:
        return iter(self.rollouts)

    def __getitem__(self, index):
        """A rollout by position; a slice is a RolloutBatch."""
        if isinstance(index, slice):
            return RolloutBatch(self.rollouts[index])
        return self.rollouts[index]

    @staticmethod
    def of(rollouts: Sequence[Rollout]) -> "RolloutBatch":
        return RolloutBatch(tuple(rollouts))

    @staticmethod
    def from_groups(groups, seed: int, step: int) -> "RolloutBatch":
        """One rollout per sampled completion of ``groups`` (``gradient.loop.rollouts.Groups``,
        prompt-major), each with the seed of its log-prob masks."""
        G = groups.rewards_P_G.shape[1]
        reward_B = groups.rewards_P_G.reshape(-1).tolist()
        correct_B = groups.correct_P_G.reshape(-1).tolist()
        traces = groups.traces or [None] * len(reward_B)
        return RolloutBatch(tuple(
            Rollout(prompt_ids=groups.prompt_ids[b], completion_ids=groups.completion_ids[b],
                    engine_logp=groups.engine_logp[b], reward=reward_B[b], correct=correct_B[b],
                    problem=groups.problems[b // G], group=b // G, trace=traces[b],
                    mask_seed=derive_seed(seed, "mask", step, b))
            for b in range(len(reward_B))))

    def take(self, order: Sequence[int]) -> "RolloutBatch":
        return RolloutBatch(tuple(self.rollouts[i] for i in order))

    def tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.rollouts)

    def with_fields(self, values: Sequence[dict]) -> "RolloutBatch":
        """Each rollout with its dict of new field values."""
        return RolloutBatch(tuple(replace(r, **v) for r, v in zip(self.rollouts, values,
                                                                    strict=True)))

    def padded(self, mask_B_T: torch.Tensor, view: int) -> PaddedBatch:
        """The micro-batch's tensors against the policy estimate's mask ``(B, T)``.

        Frozen log-probs are all present or all absent (they are frozen for every rollout
        of a step or none), and so are per-token advantages (a distillation step gives every
        kept rollout and SFT row its own), so one rollout decides for the batch."""
        T, dev = mask_B_T.shape[1], mask_B_T.device
        rs, first = self.rollouts, self.rollouts[0]
        frozen = first.old_logp is not None
        if first.per_token():
            adv_B_T = pad_rows([r.adv for r in rs], T, dev)
        else:
            adv_B_T = token_advantages(torch.tensor([r.adv for r in rs], device=dev), mask_B_T)
        return PaddedBatch(
            old_logp_B_T=pad_rows([r.old(view) for r in rs], T, dev) if frozen else None,
            is_weight_B_T=pad_rows([r.is_weight for r in rs], T, dev) if frozen else None,
            ref_logp_B_T=(pad_rows([r.ref(view) for r in rs], T, dev)
                          if first.ref_logp is not None else None),
            adv_B_T=adv_B_T,
            clip_high_B=(torch.tensor([r.clip_high for r in rs], dtype=torch.float64, device=dev)
                         if first.clip_high is not None else None),
            row_weight_B=(torch.tensor([r.row_weight for r in rs], device=dev)
                          if first.row_weight is not None else None))
