"""Keyed noise: a pure function of (run seed, iteration, direction, name), independent of
generation order and of torch's global RNG; distinct keys give uncorrelated N(0, 1) streams."""

from __future__ import annotations

import pytest
import torch

from populations.noise import (Member, direction_and_sign, draw_direction, gaussian, keyed_noise,
                               noise_key, population)

SHAPES = {"embed.weight": (7, 5), "layers.0.mlp.weight": (4, 3), "norm.bias": (5,)}


def test_noise_key_is_pinned():
    # Ledgers written by earlier runs must keep regenerating the same noise, so the key
    # scheme (blake2b, person "es-llm/noise/v1", 16-byte little-endian ints, UTF-8 name,
    # masked to 63 bits) is pinned to a value computed once; Python's salted hash() could not
    # give the same number in another process.
    assert noise_key(0, 0, 0, "w") == 5059350060066752754
    keys = {noise_key(s, i, d, n) for s in (0, 1) for i in (0, 1) for d in (0, 1)
            for n in ("w", "b")}
    assert len(keys) == 16
    assert all(0 <= k < 2 ** 63 for k in keys)


def test_noise_key_encoding_is_injective_on_near_misses():
    # "1,23" vs "12,3"-style clashes are impossible with fixed-width fields.
    assert noise_key(1, 23, 0, "w") != noise_key(12, 3, 0, "w")
    assert noise_key(0, 0, 1, "w") != noise_key(0, 1, 0, "w")


@pytest.mark.parametrize("bad", [dict(direction=-1), dict(iteration=-1), dict(run_seed=True),
                                 dict(direction=1.0), dict(name=3)])
def test_noise_key_rejects_bad_fields(bad):
    args = dict(run_seed=0, iteration=0, direction=0, name="w") | bad
    with pytest.raises(ValueError):
        noise_key(**args)


def test_same_key_same_tensor_in_any_order():
    forward = {n: keyed_noise(3, 5)(1, n, s) for n, s in SHAPES.items()}
    backward = {}
    for n, s in reversed(SHAPES.items()):
        gaussian(noise_key(3, 5, 0, "unrelated"), (100,))  # other draws in between
        torch.randn(10)  # and the global RNG moving
        backward[n] = gaussian(noise_key(3, 5, 1, n), s)
    for n in SHAPES:
        assert torch.equal(forward[n], backward[n])
        assert forward[n].dtype == torch.float32 and forward[n].device.type == "cpu"


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_a_direction_drawn_on_threads_is_the_serial_draw(threads):
    shapes = {**SHAPES, "big.weight": (300, 200), "other.weight": (50, 70)}
    serial = {n: keyed_noise(3, 5)(2, n, s) for n, s in shapes.items()}
    drawn = draw_direction(keyed_noise(3, 5), 2, shapes, threads)
    assert list(drawn) == list(shapes)
    assert all(torch.equal(drawn[n], serial[n]) for n in shapes)


def test_gaussian_leaves_global_rng_alone():
    state = torch.get_rng_state()
    gaussian(noise_key(0, 0, 0, "w"), (1000,))
    assert torch.equal(torch.get_rng_state(), state)


def test_other_dtypes_round_the_same_fp32_draw():
    key = noise_key(0, 2, 3, "w")
    fp32 = gaussian(key, (64,))
    assert torch.equal(gaussian(key, (64,), dtype=torch.bfloat16), fp32.to(torch.bfloat16))
    assert torch.equal(gaussian(key, (64,), dtype=torch.float64), fp32.double())


def _corr(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


@pytest.mark.parametrize("other", [(0, 0, 0, "b"), (0, 0, 1, "a"), (0, 1, 0, "a"),
                                   (1, 0, 0, "a")])
def test_changing_any_field_gives_uncorrelated_noise(other):
    # Over 1e5 independent pairs the sample correlation has std 1/sqrt(1e5) ~ 0.0032, so
    # |corr| < 0.05 is a 15-sigma bound. Qiu et al.'s one-seed-for-every-tensor scheme would
    # give corr = 1 for the "b" case.
    n = 100_000
    x = gaussian(noise_key(0, 0, 0, "a"), (n,))
    y = gaussian(noise_key(*other), (n,))
    assert not torch.equal(x, y)
    assert abs(_corr(x, y)) < 0.05


def test_standard_normal_moments():
    # n = 1e5: the sample mean has std 1/sqrt(n) ~ 0.0032 and the sample variance has std
    # sqrt(2/n) ~ 0.0045, so tolerances of 0.02 and 0.03 are > 6 sigma.
    x = gaussian(noise_key(9, 9, 9, "w"), (100_000,)).double()
    assert abs(float(x.mean())) < 0.02
    assert abs(float(x.var()) - 1.0) < 0.03


def test_antithetic_members_share_a_direction_with_opposite_signs():
    members = population(6, antithetic=True)
    assert [(m.direction, m.sign) for m in members] == [(0, 1), (0, -1), (1, 1), (1, -1),
                                                       (2, 1), (2, -1)]
    assert [m.index for m in members] == list(range(6))
    plain = population(3, antithetic=False)
    assert plain == (Member(0, 0, 1), Member(1, 1, 1), Member(2, 2, 1))
    assert direction_and_sign(5, True) == (2, -1)


@pytest.mark.parametrize("N, antithetic", [(5, True), (0, False), (-2, True), (2.0, False)])
def test_bad_population_sizes_raise(N, antithetic):
    with pytest.raises(ValueError):
        population(N, antithetic)
