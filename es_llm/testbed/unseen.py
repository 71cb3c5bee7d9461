"""Extra Countdown problems that a testbed model has never seen, for measuring small effects.

The default testbed's held-out file has 400 problems, so a paired difference of a few points sits at
the edge of its confidence interval. Pretraining draws its examples from a seeded stream
(``train.training_example`` under ``random.Random(f"{seed}:train")``), so the exact set of
problems the model trained on can be rebuilt without the model: replay the stream, collect
every problem key, and draw fresh problems outside it and outside every held-out set (the
RL pool included). Nothing here changes the built model, so this module is not part of the
testbed's fingerprint; it is valid for a build whose fingerprint equals the config's.
"""

from __future__ import annotations

import random

from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.train import (_countdown_example, _distinct, _problem_key, _renumber,
                                  held_out_sets, training_example)


def pretraining_keys(cfg: TestbedConfig, excluded: set[str] | None = None) -> set[str]:
    """The key of every problem the student's pretraining drew (countdown and arithmetic),
    by replaying its data stream exactly as ``train.train`` consumes it; ``excluded`` is
    what ``held_out_sets`` returns for ``cfg`` (computed when not given)."""
    if excluded is None:
        _, excluded = held_out_sets(cfg)
    rng = random.Random(f"{cfg.seed}:train")
    keys = set()
    for _ in range(cfg.train.steps * cfg.train.batch_size):
        prompt, _ = training_example(rng, cfg, excluded)
        keys.add(_key_of(prompt))
    return keys


def _key_of(prompt: str) -> str:
    """``_problem_key`` from a prompt: countdown prompts read ``nums a b c make t``."""
    words = prompt.split()
    if words and words[0] == "nums":
        return countdown_key([int(w) for w in words[1:-2]], int(words[-1]))
    return f"ar:{prompt}"


def countdown_key(numbers, target) -> str:
    """The key ``_problem_key`` gives a Countdown problem (its numbers as a multiset)."""
    return f"cd:{sorted(numbers)}:{target}"


def unseen_countdown(cfg: TestbedConfig, per_tier: int, seed: int = 0,
                     exclude: set[str] = frozenset()) -> tuple[list, dict]:
    """Up to ``per_tier`` Countdown problems per tier that neither pretraining nor any
    held-out file of the build contains, nor ``exclude`` (keys of ``countdown_key``, e.g. an
    earlier set), each with its worked ``reference``; and the number found per tier (a small
    tier, whose problems pretraining nearly exhausts, gives fewer).

    Deterministic in (config, ``seed``, ``exclude``); another ``seed`` gives another set,
    which may share problems with this one unless this one is excluded.
    """
    sets, held = held_out_sets(cfg)
    taken = held | pretraining_keys(cfg, held) | set(exclude)
    taken |= {_problem_key(p) for problems in sets.values() for p in problems}
    rng = random.Random(f"{cfg.seed}:unseen:{seed}")
    problems, found = [], {}
    for tier in cfg.data.countdown_tiers:
        drawn = _distinct(lambda: _countdown_example(rng, tier, cfg.data), per_tier, taken,
                          f"countdown tier-{tier}", strict=False)
        found[tier] = len(drawn)
        problems += drawn
    return _renumber(problems, f"countdown-unseen{seed}"), found
