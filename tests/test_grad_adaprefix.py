"""The AdaPrefix controller, withdrawal schedule and prefix length against hand values."""

from __future__ import annotations

import json

import pytest

from gradient.maths.adaprefix import (PrefixControllerConfig, PrefixState, fraction, prefix_tokens,
                                update, withdrawal)

CFG = PrefixControllerConfig(init_fraction=0.5, gain=0.4, withdraw_start=100,
                             withdraw_end=200)


def rho(state, pid):
    return state.problems[pid][0]


def test_controller_raises_rho_for_failures_and_lowers_it_for_successes():
    s0 = PrefixState()
    # Failing (0/8): rho = 0.5 + 0.4 * (0.5 - 0) = 0.7. Solved (8/8): 0.5 + 0.4 * (0.5 - 1) = 0.3.
    # At target (4/8): unchanged 0.5.
    s1 = update(s0, CFG, "hard", 0, 8)
    s1 = update(s1, CFG, "easy", 8, 8)
    s1 = update(s1, CFG, "right", 4, 8)
    assert rho(s1, "hard") == pytest.approx(0.7)
    assert rho(s1, "easy") == pytest.approx(0.3)
    assert rho(s1, "right") == 0.5
    # Further failures: 0.7 -> 0.9 -> 1.1 clipped to 1.0; further successes 0.3 -> 0.1 -> 0.
    s2 = s1
    for _ in range(2):
        s2 = update(update(s2, CFG, "hard", 0, 8), CFG, "easy", 8, 8)
    assert rho(s2, "hard") == 1.0 and rho(s2, "easy") == 0.0
    # The state is immutable: earlier states are unchanged.
    assert "hard" not in s0.problems and rho(s1, "hard") == pytest.approx(0.7)
    with pytest.raises(TypeError):
        s1.problems["hard"] = (0.0, 0.0)


def test_ema_smooths_the_success_estimate():
    cfg = PrefixControllerConfig(init_fraction=0.5, gain=0.4, withdraw_start=0,
                                 withdraw_end=10, ema=0.5)
    # Visit 1, 0/4: the first estimate is the rate itself, 0 -> rho = 0.7.
    s = update(PrefixState(), cfg, "p", 0, 4)
    assert s.problems["p"] == pytest.approx((0.7, 0.0))
    # Visit 2, 4/4: estimate 0.5 * 0 + 0.5 * 1 = 0.5 = target -> rho stays 0.7.
    s = update(s, cfg, "p", 4, 4)
    assert s.problems["p"] == pytest.approx((0.7, 0.5))
    # Visit 3, 3/4: estimate 0.5 * 0.5 + 0.5 * 0.75 = 0.625 -> rho = 0.7 - 0.4 * 0.125 = 0.65.
    s = update(s, cfg, "p", 3, 4)
    assert s.problems["p"] == pytest.approx((0.65, 0.625))


def test_withdrawal_schedule_by_hand():
    # 1 until step 100, linear to 0 at step 200: (200 - step) / 100 in between.
    expected = {0: 1.0, 50: 1.0, 100: 1.0, 150: 0.5, 175: 0.25, 199: 0.01, 200: 0.0, 300: 0.0}
    for step, w in expected.items():
        assert withdrawal(CFG, step) == pytest.approx(w), step
    # fraction = rho * w; an unvisited problem is at init_fraction.
    s = update(PrefixState(), CFG, "hard", 0, 8)  # rho 0.7
    assert fraction(s, CFG, "hard", 150) == pytest.approx(0.35)
    assert fraction(s, CFG, "new", 175) == pytest.approx(0.125)
    assert fraction(s, CFG, "hard", 250) == 0.0
    # start == end: full help before, none from that step on.
    sharp = PrefixControllerConfig(init_fraction=1.0, gain=0.1, withdraw_start=5,
                                   withdraw_end=5)
    assert [withdrawal(sharp, t) for t in (4, 5, 6)] == [1.0, 0.0, 0.0]


def test_prefix_tokens_round_down():
    ref = list(range(7))
    # floor(0.5 * 7) = 3; floor(1 * 7) = 7; floor(0.1 * 7) = 0; floor(0.99 * 10) = 9.
    assert prefix_tokens(ref, 0.5) == 3
    assert prefix_tokens(ref, 1.0) == 7
    assert prefix_tokens(ref, 0.1) == 0
    assert prefix_tokens(ref, 0.0) == 0
    assert prefix_tokens(list(range(10)), 0.99) == 9
    with pytest.raises(ValueError, match="fraction"):
        prefix_tokens(ref, 1.5)


def test_state_round_trips_through_json():
    s = update(update(PrefixState(), CFG, "a", 1, 8), CFG, "b", 7, 8)
    text = json.dumps(s.to_dict())
    back = PrefixState.from_dict(json.loads(text))
    assert back == s
    assert back.problems["a"] == s.problems["a"] and isinstance(back.problems["a"], tuple)
    assert fraction(back, CFG, "b", 0) == fraction(s, CFG, "b", 0)
    assert PrefixState.from_dict(PrefixState().to_dict()) == PrefixState()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="init_fraction"):
        PrefixControllerConfig(init_fraction=1.5, gain=0.1, withdraw_start=0,
                               withdraw_end=1)
    with pytest.raises(ValueError, match="gain"):
        PrefixControllerConfig(init_fraction=0.5, gain=0.0, withdraw_start=0,
                               withdraw_end=1)
    with pytest.raises(ValueError, match="withdraw_end"):
        PrefixControllerConfig(init_fraction=0.5, gain=0.1, withdraw_start=10,
                               withdraw_end=5)
    with pytest.raises(ValueError, match="ema"):
        PrefixControllerConfig(init_fraction=0.5, gain=0.1, withdraw_start=0,
                               withdraw_end=1, ema=1.0)
    with pytest.raises(ValueError, match="successes"):
        update(PrefixState(), CFG, "p", 9, 8)
    with pytest.raises(ValueError, match="group_size"):
        update(PrefixState(), CFG, "p", 0, 0)
    with pytest.raises(ValueError, match="rho"):
        PrefixState.from_dict({"problems": {"p": [1.2, 0.5]}})
    with pytest.raises(ValueError, match="strings"):
        PrefixState({3: (0.5, 0.5)})
    with pytest.raises(ValueError, match="problems"):
        PrefixState.from_dict({"rho": {}})
