"""Rollout-level advantage-prioritized replay for GRPO.

After arXiv 2606.04560 (read through a verl-based implementation of its
``AdvantagePrioritizedReplayBuffer``). The buffer holds single rollouts, not groups. Each is
frozen at birth: its advantage and its behaviour log-probs (inside the opaque payload, which
the buffer never looks into), so the PPO ratio of a replayed rollout measures the policy's
drift since it was generated, and the clipped loss bounds that drift.

- Priority: ``P(i) = (|A_i| + eps)^alpha / sum_j (|A_j| + eps)^alpha`` (alpha = 0.5, eps = 1e-6
  in the paper), sampled without replacement; sampling does not remove entries.
- Age eviction: a rollout is dropped once ``current_version - birth_version > tau_max``
  (10 in the paper), whatever the fill level; a FIFO capacity (30000) is the backstop.
- Fresh-anchored composition (``compose``): every update trains on all of this step's
  fresh rollouts (after any zero-variance filter the trainer applies) plus
  ``round(replay_ratio * len(fresh))`` replayed ones (replay_ratio = 0.5 in the paper),
  none during the first ``warmup_updates`` (20) updates.

Departures and the trainer's share: the paper nudges the replay count so the batch divides
the data-parallel size; that is batch geometry, so the trainer trims or pads the list
``compose`` returns. The paper's rollouts carry one sequence advantage; a rollout whose
advantage is per token (a distillation method's) enters with the mean over its tokens as
its ``A_i``. ``version`` is the number of optimizer updates applied to the policy
that generated the fresh rollouts. All randomness comes from the ``torch.Generator`` passed
in (a CPU generator): the same buffer contents and generator state give the same draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class ReplayConfig:
    """Settings of the replay buffer (defaults from arXiv 2606.04560); raises ValueError on
    invalid values."""

    # A rollout is evicted once the policy is more than this many updates past its birth.
    tau_max: int = 10
    # Most rollouts held; past it the earliest added go first (a backstop to tau_max).
    capacity: int = 30000
    # Priority exponent: P(i) ~ (|A_i| + eps)^alpha; 0 = uniform, 1 = proportional to |A|.
    alpha: float = 0.5
    # Added to |A| so that rollouts with a zero advantage keep a small chance (> 0).
    eps: float = 1e-6
    # No rollouts are replayed while the policy version is below this.
    warmup_updates: int = 20

    def __post_init__(self):
        if not (_is_int(self.tau_max) and self.tau_max >= 0):
            raise ValueError(f"tau_max must be an integer >= 0, got {self.tau_max!r}")
        if not (_is_int(self.capacity) and self.capacity >= 1):
            raise ValueError(f"capacity must be a positive integer, got {self.capacity!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha < math.inf):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        if not (isinstance(self.eps, (int, float)) and 0 < self.eps < math.inf):
            raise ValueError(f"eps must be a positive finite number, got {self.eps!r}")
        if not (_is_int(self.warmup_updates) and self.warmup_updates >= 0):
            raise ValueError(f"warmup_updates must be an integer >= 0, got "
                             f"{self.warmup_updates!r}")


@dataclass(frozen=True)
class ReplayItem:
    """One stored rollout. ``payload`` is whatever the trainer needs to train on it again
    (token ids, mask, frozen behaviour log-probs, per-token advantages); the buffer only uses
    ``advantage`` (the scalar advantage at birth) and ``birth_version``."""

    payload: Any
    advantage: float
    birth_version: int


def _advantage(a) -> float:
    value = float(a)
    if not math.isfinite(value):
        raise ValueError(f"a rollout's advantage must be finite, got {a!r}")
    return value


class AdvantageReplayBuffer:
    """The replay store; mutable, driver-side and CPU-only (it holds no device state)."""

    def __init__(self, cfg: ReplayConfig):
        self.cfg = cfg
        # Insertion order, earliest first: the FIFO backstop drops from the front.
        self._items: list[ReplayItem] = []

    def __len__(self) -> int:
        return len(self._items)

    @property
    def items(self) -> tuple[ReplayItem, ...]:
        """The stored rollouts, earliest added first."""
        return tuple(self._items)

    def add(self, items: Iterable[tuple[Any, float]], version: int) -> list[ReplayItem]:
        """Store ``(payload, advantage)`` pairs born at policy ``version``; returns them as
        ReplayItems. Past ``capacity`` the earliest stored rollouts are dropped."""
        if not _is_int(version):
            raise ValueError(f"version must be an integer, got {version!r}")
        born = [ReplayItem(payload, _advantage(adv), version) for payload, adv in items]
        self._items.extend(born)
        excess = len(self._items) - self.cfg.capacity
        if excess > 0:
            del self._items[:excess]
        return born

    def evict(self, current_version: int) -> int:
        """Drop rollouts with ``current_version - birth_version > tau_max``; returns how many."""
        before = len(self._items)
        self._items = [it for it in self._items
                       if current_version - it.birth_version <= self.cfg.tau_max]
        return before - len(self._items)

    def priorities(self) -> torch.Tensor:
        """Sampling probabilities of the stored rollouts, float64, in storage order."""
        adv = torch.tensor([it.advantage for it in self._items], dtype=torch.float64)
        w = (adv.abs() + self.cfg.eps).pow(self.cfg.alpha)
        return w / w.sum()

    def sample(self, k: int, generator: torch.Generator) -> list[ReplayItem]:
        """``k`` distinct stored rollouts drawn by priority, without replacement; the buffer
        keeps them. Raises ValueError if ``k`` exceeds the number stored."""
        if not (_is_int(k) and 0 <= k <= len(self._items)):
            raise ValueError(f"cannot sample {k!r} rollouts from a buffer of {len(self._items)}")
        if k == 0:
            return []
        idx = torch.multinomial(self.priorities(), k, replacement=False, generator=generator)
        return [self._items[i] for i in idx.tolist()]

    def compose(self, fresh: Sequence[tuple[Any, float]], replay_ratio: float, version: int,
                generator: torch.Generator) -> list[ReplayItem]:
        """The training rollouts of update ``version``: all ``fresh`` ones, then the replayed.

        In order: evict by age at ``version``; draw
        ``min(round_half_up(replay_ratio * len(fresh)), len(buffer))`` stored rollouts (none
        while ``version < warmup_updates``); store the fresh ones (born at ``version``) for
        later updates. Fresh rollouts therefore never replay in their own update.
        """
        if not (isinstance(replay_ratio, (int, float)) and 0 <= replay_ratio < math.inf):
            raise ValueError(f"replay_ratio must be a finite number >= 0, got {replay_ratio!r}")
        self.evict(version)
        wanted = 0
        if version >= self.cfg.warmup_updates:
            # Half up: 0.5 * 5 fresh asks for 3, where round() (half to even) would give 2.
            wanted = min(math.floor(replay_ratio * len(fresh) + 0.5), len(self._items))
        replayed = self.sample(wanted, generator)
        return self.add(fresh, version) + replayed

    def state_dict(self) -> dict:
        """``{"items": [{"payload", "advantage", "birth_version"}, ...]}``, earliest first.

        Payloads are included as they are (not copied): the dict can be written with
        ``torch.save`` when payloads are tensors and plain containers, and as JSON only when
        the payloads are JSON-safe themselves.
        """
        return {"items": [{"payload": it.payload, "advantage": it.advantage,
                           "birth_version": it.birth_version} for it in self._items]}

    def load_state_dict(self, state: Mapping) -> None:
        """Replace the contents with those of ``state_dict()`` (the config stays this
        buffer's own; the capacity is re-applied). Raises ValueError on a malformed dict."""
        if not isinstance(state, Mapping) or not isinstance(state.get("items"), list):
            raise ValueError("a replay-buffer state dict must hold an 'items' list")
        items = []
        for d in state["items"]:
            if not (isinstance(d, Mapping) and {"payload", "advantage", "birth_version"} <= set(d)
                    and _is_int(d["birth_version"])):
                raise ValueError(f"malformed replay item {d!r}")
            items.append(ReplayItem(d["payload"], _advantage(d["advantage"]), d["birth_version"]))
        self._items = items[max(0, len(items) - self.cfg.capacity):]
