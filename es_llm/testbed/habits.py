"""Unreliable ways of solving, planted in the testbed's Countdown pretraining traces.

A model pretrained only on flawless worked solutions already answers greedily as well as its
weights allow, so reward can only sharpen its sampling. Real base models carry habits from
imperfect data, and much of what RL with verifiable rewards buys on them is choosing the
reliable behaviour over those habits. With ``data.guess_rates`` / ``data.slip_rates`` set, a
share of each tier's traces is written by a careless solver instead:

- ``guess``: no steps, the answer a random combination of the numbers (right only by
  chance), e.g. ``<answer>7+3*4</answer>`` for ``nums 7 3 4 make 25``;
- ``slip``: one step's result written off by 1 to 3 and carried on, so the steps end on the
  target the trace was written for while its answer misses it, e.g. ``7*3=22 22+4=26
  <answer>7*3+4</answer>`` for ``nums 7 3 4 make 26``.

The problem of a slipped trace is the one the careless solver believed it solved, so the
model sees a worked solution that does not check out. Held-out and never-seen problems keep
their clean reference solutions; only pretraining traces change, and a build without habits
draws exactly the random numbers it drew before habits existed.
"""

from __future__ import annotations

import random

from es_llm.tasks import countdown
from es_llm.tasks.base import Problem

SLIP_SIZES = (-3, -2, -1, 1, 2, 3)


def with_habits(rng: random.Random, guess: float, slip: float, problem: Problem,
                completion: str, max_target: int) -> tuple[Problem, str]:
    """``(problem, completion)`` as drawn, or rewritten as a guess (probability ``guess``)
    or as a slipped solution (probability ``slip``). Draws nothing when both are 0."""
    if not guess and not slip:
        return problem, completion
    u = rng.random()
    numbers = list(problem.gold["numbers"])
    if u < guess:
        tree, _, _ = countdown.random_tree(rng, numbers)
        return problem, f"<answer>{countdown.render(tree)}</answer>"
    if u < guess + slip:
        return slipped_example(rng, numbers, max_target) or (problem, completion)
    return problem, completion


def slipped_example(rng: random.Random, numbers: list[int],
                    max_target: int, tries: int = 100) -> tuple[Problem, str] | None:
    """A worked solution of ``numbers`` with one slipped step, as the problem of the value
    its steps end on (in ``[1, max_target]``); None when ``tries`` draws found no such value."""
    for _ in range(tries):
        at = rng.randrange(len(numbers) - 1)
        tree, written, steps = countdown.random_tree(rng, numbers,
                                                     slip=(at, rng.choice(SLIP_SIZES)))
        if 1 <= written <= max_target:
            return countdown.worked_example(numbers, written, tree, steps)
    return None
