"""Unreliable traces in the testbed's pretraining data: the careless solver's traces are what
they claim to be, they come at the configured rates, a build without them draws exactly the
stream it drew before they existed, and never-seen problems stay outside pretraining."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import countdown
from es_llm.testbed.config import load_testbed_config
from es_llm.testbed.habits import slipped_example, with_habits
from es_llm.testbed.train import held_out_sets, training_example
from es_llm.testbed.unseen import _key_of, pretraining_keys, unseen_countdown

HABITS = ["data.guess_rates=[0.1,0.3,0.5]", "data.slip_rates=[0.05,0.1,0.2]"]


def trace_kind(completion: str) -> str:
    """Which way a Countdown completion went: ``guess`` (an answer without steps), ``slip``
    (steps whose arithmetic is wrong somewhere) or ``clean`` (every step's arithmetic
    holds, whether or not it reaches the target): how these tests tell the careless
    solver's traces apart."""
    text = completion.split("<answer>", 1)[0].split()
    if not text:
        return "guess"
    return "clean" if all(_step_holds(step) for step in text) else "slip"


def _step_holds(step: str) -> bool:
    """``a<op>b=c`` with c = a op b exactly; anything else (a malformed step too) fails."""
    left, eq, right = step.partition("=")
    if not eq or not right.isdigit():
        return False
    for op in "+-*/":
        a, sep, b = left.partition(op)
        if sep and a.isdigit() and b.isdigit():
            x, y = int(a), int(b)
            if op == "/":
                return y != 0 and Fraction(x, y) == int(right)
            return {"+": x + y, "-": x - y, "*": x * y}[op] == int(right)
    return False


def test_a_slip_changes_one_written_result_and_carries_it_on():
    rng = random.Random(0)
    for _ in range(200):
        numbers = [rng.randint(1, 15) for _ in range(rng.randint(2, 5))]
        at, by = rng.randrange(len(numbers) - 1), rng.choice((-3, -2, -1, 1, 2, 3))
        tree, written, steps = countdown.random_tree(rng, numbers, slip=(at, by))
        # Exactly the slipped step fails, its result is off by |by| at most, and the last
        # step ends on the written value, which the answer's tree does not reach.
        failing = [i for i, step in enumerate(steps) if trace_kind(step) == "slip"]
        assert failing == [at]
        assert int(steps[-1].split("=")[1]) == written
        assert countdown.evaluate(tree) != Fraction(written)
        assert sorted(countdown.leaves(tree)) == sorted(numbers)


def test_a_slipped_example_is_the_problem_the_solver_believed_it_solved():
    problem, completion = slipped_example(random.Random(1), [7, 3, 4], max_target=99)
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    assert problem.prompt == countdown.render_prompt(numbers, target)
    assert trace_kind(completion) == "slip"
    assert countdown.score_completion(numbers, target, completion).reward == 0.0


def test_without_habits_nothing_is_drawn_and_the_stream_is_unchanged():
    rng = random.Random(5)
    problem, completion = countdown.generate(rng, 3)
    state = rng.getstate()
    assert with_habits(rng, 0.0, 0.0, problem, completion, 99) == (problem, completion)
    assert rng.getstate() == state
    # The first 2,000 pretraining examples of both presets, as drawn before habits existed.
    for size, digest in (("ci", "40fc7b1d18d2755d"), ("default", "3429c6f45388be8c")):
        cfg = load_testbed_config(size)
        _, excluded = held_out_sets(cfg)
        rng, h = random.Random(f"{cfg.seed}:train"), hashlib.sha256()
        for _ in range(2000):
            prompt, completion = training_example(rng, cfg, excluded)
            h.update(f"{prompt}\x1f{completion}\x1e".encode())
        assert h.hexdigest()[:16] == digest, size


def test_habits_come_at_the_configured_rates_per_tier():
    cfg = load_testbed_config("ci", overrides=HABITS)
    _, excluded = held_out_sets(cfg)
    rng, kinds = random.Random("rates"), {t: Counter() for t in cfg.data.countdown_tiers}
    for _ in range(30_000):
        prompt, completion = training_example(rng, cfg, excluded)
        if prompt.startswith("nums "):
            kinds[len(prompt.split()) - 3][trace_kind(completion)] += 1
    for tier, guess, slip in zip(cfg.data.countdown_tiers, cfg.data.guess_rates,
                                 cfg.data.slip_rates):
        total = sum(kinds[tier].values())
        for kind, rate in (("guess", guess), ("slip", slip), ("clean", 1 - guess - slip)):
            # Within 4.5 binomial standard deviations of the configured share.
            sd = math.sqrt(rate * (1 - rate) / total)
            assert abs(kinds[tier][kind] / total - rate) < 4.5 * sd + 1e-9, (tier, kind)


def test_never_seen_problems_stay_outside_pretraining_with_habits():
    cfg = load_testbed_config("ci", overrides=[*HABITS, "train.steps=40", "train.batch_size=16"])
    keys = pretraining_keys(cfg)
    # Slipped traces are problems of their own (another target) and count as seen.
    _, excluded = held_out_sets(cfg)
    rng, slipped = random.Random(f"{cfg.seed}:train"), set()
    for _ in range(cfg.train.steps * cfg.train.batch_size):
        prompt, completion = training_example(rng, cfg, excluded)
        if trace_kind(completion) == "slip":
            slipped.add(_key_of(prompt))
    assert slipped and slipped <= keys
    problems, _ = unseen_countdown(cfg, per_tier=15)
    assert problems and not {_key_of(p.prompt) for p in problems} & (keys | excluded)


@pytest.mark.parametrize("overrides, fragment", [
    (["data.guess_rates=[0.1,0.2]"], "one share in [0, 1] per countdown tier"),
    (["data.slip_rates=[0.1,1.5,0.1]"], "one share in [0, 1] per countdown tier"),
    (["data.guess_rates=[0.6,0.6,0.6]", "data.slip_rates=[0.5,0.5,0.5]"], "at most 1 per tier"),
])
def test_bad_rates_are_refused(overrides, fragment):
    with pytest.raises(BadInput) as refused:
        load_testbed_config("ci", overrides=overrides)
    assert fragment in str(refused.value)


def test_the_habits_preset_plants_guesses_and_the_default_none():
    habits, default = load_testbed_config("habits"), load_testbed_config("default")
    assert len(habits.data.guess_rates) == len(habits.data.countdown_tiers)
    assert not default.data.guess_rates and not default.data.slip_rates
    _, excluded = held_out_sets(habits)
    rng = random.Random(f"{habits.seed}:train")
    kinds = Counter()
    for _ in range(2000):
        prompt, completion = training_example(rng, habits, excluded)
        if prompt.startswith("nums "):
            kinds[trace_kind(completion)] += 1
    assert kinds["guess"] > 0.2 * sum(kinds.values()) and kinds["slip"] == 0
