"""AdaPrefix-GRPO: per-problem reference-prefix assistance held at a target success rate.

Source: Beliaev 2026, "Max Out GRPO Signal" (arXiv 2607.07674). Only the abstract is
primary: a correct prefix of the reference solution is prepended, its length is the
difficulty knob, a feedback controller adjusts each problem's prefix length to hold its
success rate near 50%, and the assistance is then withdrawn entirely, so the final model
solves the problems unaided; the method is data preparation plus a loss mask, with a stock
trainer. Everything below that is more specific is this project's reading [INFER]:

- State: per problem p a fraction ``rho_p`` in [0, 1] of the reference tokens to give,
  starting at ``init_fraction``, and a success estimate.
- Update after each visit (a group of G rollouts, s successes, measured *with* the prefix
  that was given): ``s_hat = s / G`` (or its EMA), then
  ``rho_p <- clip(rho_p + gain * (target - s_hat), 0, 1)``. A problem the model fails gets
  more of the solution, one it solves gets less. With binary rewards the GRPO signal (the
  group reward variance s(1 - s)) is largest at s = 0.5, hence ``target`` = 0.5. A digest
  of the paper (unverified) mentions an EMA and updates every ~10 steps; the EMA is
  ``ema``, the cadence is the trainer's (call ``update`` when it wants).
- Withdrawal: the prefix given at step t is ``rho_p * w(t)``, where w is 1 until
  ``withdraw_start``, falls linearly to 0 at ``withdraw_end`` and stays 0, so
  the last phase of training sees no help at all. The controller keeps updating ``rho_p``
  from the (now harder) visits; that no longer matters once w = 0.

Loss mask, the design chosen: the prefix is part of the **prompt**. The trainer builds the
prompt as ``prompt_ids + reference_ids[:prefix_tokens(reference_ids, fraction)]`` (token
ids concatenated, never re-tokenised text, so the boundary cannot merge tokens), the engine
continues from there, and the completion is what the model generated. The prefix then gets
mask 0, no old/behaviour log-probs and no ratio for free, exactly like prompt tokens, and
no loss or engine code needs to know about prefixes. (The alternative, prefix tokens inside
the completion with a second mask, would make every log-prob, length and overlong
computation aware of a prompt-like region in the middle of the completion.) Two things the
trainer must still decide: the reward is judged on ``prefix + completion`` (the attempt is
the whole solution; with a full prefix the answer may already sit in the prefix), and the
completion length budget excludes the prefix.

State is immutable: ``update`` returns a new ``PrefixState``; ``to_dict``/``from_dict``
give a JSON-safe form for resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from populations.numbers import is_finite_number


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class PrefixControllerConfig:
    """Settings of the prefix controller; raises ValueError on invalid values."""

    # Fraction of the reference solution a problem gets before its first visit, in [0, 1].
    init_fraction: float = 0.5
    # Controller gain: change of the fraction per unit of success-rate error (> 0).
    gain: float = 0.5
    # Last step at which the controller's fraction is given in full; withdrawal starts here.
    withdraw_start: int = 50
    # First step at which no prefix is given at all (>= withdraw_start).
    withdraw_end: int = 80
    # Success rate the controller holds each problem at, in (0, 1).
    target: float = 0.5
    # Weight of the previous success estimate in its EMA, in [0, 1); 0 = last visit only.
    ema: float = 0.0

    def __post_init__(self):
        if not (is_finite_number(self.init_fraction) and 0 <= self.init_fraction <= 1):
            raise ValueError(f"init_fraction must lie in [0, 1], got {self.init_fraction!r}")
        if not (is_finite_number(self.gain) and self.gain > 0):
            raise ValueError(f"gain must be a positive number, got {self.gain!r}")
        if not (_is_int(self.withdraw_start) and self.withdraw_start >= 0):
            raise ValueError(f"withdraw_start must be an integer >= 0, got "
                             f"{self.withdraw_start!r}")
        if not (_is_int(self.withdraw_end)
                and self.withdraw_end >= self.withdraw_start):
            raise ValueError(f"withdraw_end must be an integer >= withdraw_start "
                             f"({self.withdraw_start}), got {self.withdraw_end!r}")
        if not (is_finite_number(self.target) and 0 < self.target < 1):
            raise ValueError(f"target must lie in (0, 1), got {self.target!r}")
        if not (is_finite_number(self.ema) and 0 <= self.ema < 1):
            raise ValueError(f"ema must lie in [0, 1) (0 = no averaging), got {self.ema!r}")


def _check_unit(name: str, x) -> float:
    if not (is_finite_number(x) and 0 <= x <= 1):
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")
    return float(x)


@dataclass(frozen=True)
class PrefixState:
    """Controller state: problem id -> ``(rho, success_estimate)``, both in [0, 1].

    Problems never visited are absent and sit at ``init_fraction``. The mapping is read-only;
    ``update`` builds a new state. Raises ValueError on non-string ids or values outside
    [0, 1].
    """

    # Per visited problem: (fraction of the reference given, success-rate estimate).
    problems: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self):
        frozen = {}
        for pid, value in dict(self.problems).items():
            if not isinstance(pid, str):
                raise ValueError(f"problem ids must be strings, got {pid!r}")
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise ValueError(f"problem {pid!r}: expected (rho, success), got {value!r}")
            frozen[pid] = (_check_unit(f"rho of {pid!r}", value[0]),
                           _check_unit(f"success of {pid!r}", value[1]))
        object.__setattr__(self, "problems", MappingProxyType(frozen))

    def to_dict(self) -> dict:
        """A JSON-safe dict: ``{"problems": {id: [rho, success]}}``."""
        return {"problems": {pid: [rho, s] for pid, (rho, s) in self.problems.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "PrefixState":
        """The state ``to_dict`` described; raises ValueError on a malformed dict."""
        if not isinstance(d, Mapping) or not isinstance(d.get("problems"), Mapping):
            raise ValueError("a prefix-controller state dict must hold a 'problems' mapping")
        return cls({pid: tuple(v) if isinstance(v, list) else v
                    for pid, v in d["problems"].items()})


def withdrawal(cfg: PrefixControllerConfig, step: int) -> float:
    """The assistance multiplier w(step): 1 up to ``withdraw_start``, linear down to 0
    at ``withdraw_end``, 0 from then on (so with start == end it drops at once)."""
    if step >= cfg.withdraw_end:
        return 0.0
    if step <= cfg.withdraw_start:
        return 1.0
    return (cfg.withdraw_end - step) / (cfg.withdraw_end - cfg.withdraw_start)


def fraction(state: PrefixState, cfg: PrefixControllerConfig, pid: str, step: int) -> float:
    """The fraction of problem ``pid``'s reference to give at ``step``: ``rho_p * w(step)``."""
    rho = state.problems[pid][0] if pid in state.problems else cfg.init_fraction
    return rho * withdrawal(cfg, step)


def update(state: PrefixState, cfg: PrefixControllerConfig, pid: str, successes: float,
           group_size: int) -> PrefixState:
    """A new state after a visit of ``pid``: ``group_size`` rollouts, ``successes`` of them
    correct (a count, or a sum of rewards in [0, 1]).

    ``s_hat = ema * previous + (1 - ema) * successes / group_size`` (the first visit takes the
    rate as is), then ``rho <- clip(rho + gain * (target - s_hat), 0, 1)``. ``state`` itself
    is unchanged.
    """
    if not (_is_int(group_size) and group_size >= 1):
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if not (is_finite_number(successes) and 0 <= successes <= group_size):
        raise ValueError(f"successes must lie in [0, group_size] = [0, {group_size}], got "
                         f"{successes!r}")
    rate = successes / group_size
    if pid in state.problems:
        rho, previous = state.problems[pid]
        s_hat = cfg.ema * previous + (1 - cfg.ema) * rate
    else:
        rho, s_hat = cfg.init_fraction, rate
    new_rho = min(max(rho + cfg.gain * (cfg.target - s_hat), 0.0), 1.0)
    problems = dict(state.problems)
    # Rounding in the EMA can leave s_hat a hair outside [0, 1]; the state keeps it inside.
    problems[pid] = (new_rho, min(max(s_hat, 0.0), 1.0))
    return PrefixState(problems)


def prefix_tokens(reference_ids: Sequence, fraction: float) -> int:
    """How many leading reference tokens to give: ``floor(fraction * len(reference_ids))``.

    Rounding down means the prefix never exceeds the fraction, a full solution is given only
    at fraction 1, and a short reference with a small fraction gets no prefix at all.
    """
    f = _check_unit("fraction", fraction)
    return math.floor(f * len(reference_ids))
