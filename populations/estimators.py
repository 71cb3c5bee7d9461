"""The ES gradient estimate over a named parameter set, one noise tensor at a time.

For members n = 0..N-1 with weights w_n, signs s_n and noise directions d_n,

    g[name] = (1/N) * sum_n w_n * s_n * eps_{d_n}[name]            (Qiu et al. 2025, Alg. 2)

and, with ``sigma`` given, the textbook estimator g / sigma (Salimans et al. 2017, eq. 1). Qiu
et al. fold 1/sigma into the learning rate (alpha absorbs sigma); leaving ``sigma=None``
does the same. Sign convention: g points uphill, toward higher reward; optimizers in this
package *add* it.

The sum is regrouped by direction first: c_d = (1/N) * sum_{n: d_n = d} w_n * s_n, so an
antithetic pair contributes (w_+ - w_-) / N * eps_j and each direction's noise is generated
once; directions whose coefficient is exactly 0 (e.g. a tied pair under binary rewards) are
skipped, which changes nothing since adding 0 * eps is exact.

Memory: one fp32 accumulator of the tensor's size plus one noise tensor; the N noise vectors
are never held together. Accumulation is fp32 whatever the parameter dtype (es-at-scale
found updates of ~1e-5 vanish when summed in fp16/bf16).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from populations.noise import Member, NoiseFn


def direction_coefficients(weights_N: torch.Tensor, members: Sequence[Member], *,
                           sigma: float | None = None) -> tuple[tuple[int, float], ...]:
    """``((d, c_d), ...)`` sorted by direction: c_d = sum_{n: d_n = d} w_n s_n / (N [sigma]).

    ``weights_N[i]`` is the shaped fitness of ``members[i]``, which must have ``index == i``.
    Coefficients are summed in float64 in member order; zero coefficients are dropped.
    Raises ValueError on mismatched lengths, misordered members or a non-positive sigma.
    """
    if weights_N.dim() != 1 or weights_N.numel() != len(members):
        raise ValueError(f"weights_N must have shape ({len(members)},) to match the members, "
                         f"got {tuple(weights_N.shape)}")
    if any(m.index != i for i, m in enumerate(members)):
        raise ValueError("members must be in row order (members[i].index == i)")
    if sigma is not None and not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a positive finite number or None, got {sigma!r}")
    N = len(members)
    scale = N * (1.0 if sigma is None else float(sigma))
    w_N = weights_N.detach().to("cpu", torch.float64).tolist()
    coef: dict[int, float] = {}
    for m, w in zip(members, w_N):
        coef[m.direction] = coef.get(m.direction, 0.0) + m.sign * w
    return tuple((d, c / scale) for d, c in sorted(coef.items()) if c != 0.0)


def accumulate(coefs: Sequence[tuple[int, float]], name: str, shape: torch.Size,
               noise_for: NoiseFn, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``sum_d c_d * noise_for(d, name, shape)`` as a float32 tensor of ``shape`` on ``device``.

    Terms are added in the order of ``coefs`` (sorted by direction), so the result is
    bitwise reproducible on a given device type. Each c_d is rounded to fp32 when it
    multiplies the noise.
    """
    acc = torch.zeros(shape, dtype=torch.float32, device=device)
    for d, c in coefs:
        eps = noise_for(d, name, shape).to(device=acc.device, dtype=torch.float32)
        acc.add_(eps, alpha=c)
    return acc
