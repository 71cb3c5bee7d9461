"""The ES estimate: one step checked by hand, the paired form against the member-by-member
formula, and statistical checks that it recovers known gradients."""

from __future__ import annotations

import pytest
import torch

from populations import es
from populations.estimators import accumulate, direction_coefficients
from populations.noise import Member, gaussian, keyed_noise, noise_key, population
from populations.shaping import shape_fitness


@pytest.mark.parametrize("shaping, divide_by_sigma", [("raw", False), ("raw", True),
                                                      ("zscore", False)])
def test_one_sgd_step_by_hand(shaping, divide_by_sigma):
    # theta = [1, 2, 3] as one tensor "w"; 2 members, not mirrored: member n uses eps_n.
    cfg = es.ESConfig(population=2, sigma=0.5, antithetic=False, shaping=shaping,
                      divide_by_sigma=divide_by_sigma, optimizer="sgd", lr=0.1)
    state = es.init(cfg, {"w": torch.tensor([1.0, 2.0, 3.0])}, 7)
    eps0 = gaussian(noise_key(7, 0, 0, "w"), (3,))
    eps1 = gaussian(noise_key(7, 0, 1, "w"), (3,))
    # The members are evaluated at theta + 0.5 eps_n.
    assert torch.equal(es.perturbed_params(cfg, state, es.ask(cfg, state)[1])["w"],
                       torch.tensor([1.0, 2.0, 3.0]) + 0.5 * eps1)
    # Member fitness = row means = [(3 + 1)/2, 0] = [2, 0].
    #   raw:    w = [2 - 1, 0 - 1] = [1, -1]
    #   zscore: mean 1, population std 1, w = [1, -1] / (1 + 1e-8)
    # g = (1/N) sum_n w_n eps_n = (eps0 - eps1) / 2 * scale, and with divide_by_sigma the
    # estimate is divided by 0.5. SGD ascent: theta' = theta + 0.1 g.
    rewards_N_P = torch.tensor([[3.0, 1.0], [0.0, 0.0]])
    new, metrics = es.tell(cfg, state, rewards_N_P)
    scale = 1 / (1 + 1e-8) if shaping == "zscore" else 1.0
    g = (eps0.double() - eps1.double()) / 2 * scale / (0.5 if divide_by_sigma else 1.0)
    expected = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) + 0.1 * g
    assert torch.allclose(new.params["w"].double(), expected, rtol=0, atol=1e-6)
    assert new.iteration == 1 and state.iteration == 0
    assert metrics["update_norm"] == pytest.approx(float((0.1 * g).norm()), rel=1e-5)
    assert metrics["update_ratio"] == pytest.approx(metrics["update_norm"] / 14 ** 0.5)
    assert metrics["reward_mean"] == 1.0 and metrics["reward_max"] == 2.0
    # The next iteration draws fresh noise: keys include the iteration.
    assert not torch.equal(es.noise_for(cfg, new)(0, "w", (3,)), eps0)


def _gradient(weights_N, members, shapes, noise_for, sigma=None):
    """The estimate as ``es.tell`` forms it under full noise: the coefficients once, then one
    accumulation per tensor."""
    coefs = direction_coefficients(weights_N, members, sigma=sigma)
    return {n: accumulate(coefs, n, torch.Size(s), noise_for) for n, s in shapes.items()}


def _reference_gradient(weights_N, members, shapes, run_seed, iteration, sigma=1.0):
    """The textbook loop: every member regenerates its own signed noise, summed in fp64."""
    out = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
    for w, m in zip(weights_N.tolist(), members):
        for n, s in shapes.items():
            eps = gaussian(noise_key(run_seed, iteration, m.direction, n), s).double()
            out[n] += w * (m.sign * eps)
    return {n: g / (len(members) * sigma) for n, g in out.items()}


def test_antithetic_pairing_equals_the_member_by_member_formula():
    shapes = {"a": (4, 3), "b": (5,)}
    members = population(8, antithetic=True)
    weights_N = torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    calls = []

    def counting_noise(d, name, shape):
        calls.append((d, name))
        return keyed_noise(2, 3)(d, name, shape)

    got = _gradient(weights_N, members, shapes, counting_noise, sigma=0.25)
    ref = _reference_gradient(weights_N, members, shapes, 2, 3, sigma=0.25)
    for n in shapes:
        assert got[n].dtype == torch.float32 and got[n].shape == ref[n].shape
        assert torch.allclose(got[n].double(), ref[n], rtol=1e-6, atol=1e-6)
    # Each of the 4 directions is generated once per tensor, not once per member.
    assert sorted(calls) == sorted((d, n) for d in range(4) for n in shapes)


def test_tied_pairs_skip_their_noise_and_change_nothing():
    # Pair 1 ties (w_+ = w_-), so its coefficient (w_+ - w_-)/N is exactly 0.
    members = population(4, antithetic=True)
    weights_N = torch.tensor([1.0, -1.0, 0.5, 0.5], dtype=torch.float64)
    assert direction_coefficients(weights_N, members) == ((0, 0.5),)  # (1 - -1) / 4
    calls = []
    got = accumulate(((0, 0.5),), "w", torch.Size([6]),
                     lambda d, n, s: calls.append(d) or keyed_noise(0, 0)(d, n, s))
    assert calls == [0]
    ref = _reference_gradient(weights_N, members, {"w": (6,)}, 0, 0)["w"]
    assert torch.allclose(got.double(), ref, atol=1e-7)


def test_sigma_division_is_an_exact_rescaling():
    # Dividing by sigma = 0.5 multiplies every coefficient by 2; scaling by a power of two
    # commutes with float rounding, so the results agree bitwise.
    members = population(6, antithetic=False)
    w = torch.linspace(-1, 1, 6, dtype=torch.float64)
    shapes = {"w": (10,)}
    a = _gradient(w, members, shapes, keyed_noise(0, 0), sigma=0.5)["w"]
    b = _gradient(w, members, shapes, keyed_noise(0, 0))["w"]
    assert torch.equal(a, 2 * b)


@pytest.mark.parametrize("kwargs", [dict(sigma=0.0), dict(sigma=-1.0)])
def test_bad_sigma_raises(kwargs):
    with pytest.raises(ValueError):
        direction_coefficients(torch.ones(2), population(2, False), **kwargs)


def test_mismatched_or_misordered_members_raise():
    with pytest.raises(ValueError):
        direction_coefficients(torch.ones(3), population(2, False))
    with pytest.raises(ValueError):
        direction_coefficients(torch.ones(2), (Member(1, 1, 1), Member(0, 0, 1)))


def _estimate(f, theta, N, sigma, antithetic, seed=0):
    """Evaluate f at every member of one iteration and return the textbook estimate."""
    cfg = es.ESConfig(population=N, sigma=sigma, antithetic=antithetic, shaping="raw",
                      divide_by_sigma=True)
    state = es.init(cfg, theta, seed)
    members = es.ask(cfg, state)
    rewards_N_P = torch.tensor([[f(es.perturbed_params(cfg, state, m))] for m in members],
                               dtype=torch.float64)
    weights_N = shape_fitness("raw", rewards_N_P)
    shapes = {k: v.shape for k, v in theta.items()}
    return _gradient(weights_N, members, shapes, es.noise_for(cfg, state), sigma=sigma)


THETA = {"x": torch.tensor([0.3, -0.1]), "y": torch.tensor([0.2])}


def _flat(d):
    return torch.cat([d["x"], d["y"]]).double()


def test_antithetic_estimate_of_a_linear_function_is_its_slope():
    """Probabilistic (fixed seed): for f = a.theta, mirrored members give
    (f(th + s e) - f(th - s e)) / (2 s) * e = (a.e) e, whose mean over M = 10^4 pairs estimates
    E[e e^T] a = a. Per coordinate the variance is (|a|^2 + a_i^2) / M <= 10.5 / 10^4, a std
    <= 0.033, so atol 0.15 is a > 4.5-sigma bound."""
    a = torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64)
    g = _estimate(lambda p: float(_flat(p) @ a), THETA, N=20_000, sigma=0.1, antithetic=True)
    assert torch.allclose(_flat(g), a, atol=0.15)


@pytest.mark.parametrize("antithetic", [True, False])
def test_estimate_of_a_quadratic_is_its_gradient(antithetic):
    """Probabilistic (fixed seed): f = -|theta - c|^2 has gradient -2 (theta - c)
    = [1.4, -1.8, 0.6] at theta = [0.3, -0.1, 0.2], c = [1, -1, 0.5]. Gaussian smoothing only
    adds a constant (-sigma^2 D), so the smoothed gradient is the same. Mirrored pairs cancel
    the quadratic term exactly (std per coordinate <= 0.03 with 10^4 pairs); unmirrored
    members keep it as extra variance and the mean baseline shrinks the estimate by
    (N-1)/N = 0.99995, both far inside atol 0.15."""
    c = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    g = _estimate(lambda p: -float(((_flat(p) - c) ** 2).sum()), THETA, N=20_000, sigma=0.1,
                  antithetic=antithetic, seed=1)
    assert torch.allclose(_flat(g), torch.tensor([1.4, -1.8, 0.6], dtype=torch.float64),
                          atol=0.15)
