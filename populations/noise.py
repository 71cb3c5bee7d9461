"""Keyed Gaussian noise for seed-only ES, and the member -> (direction, sign) map.

Every perturbation tensor is a pure function of ``(run_seed, iteration, direction, name)``:
``gaussian(noise_key(run_seed, iteration, direction, name), shape)``. Nothing depends on the
order in which tensors are visited, on how many ranks share the population, on the device
or on the inference backend, so every rank can rebuild any member's noise from the ledger.

Departures from the reference implementations:

* Qiu et al. 2025 (arXiv 2509.24372) reseed a fresh generator with the *same* seed for every
  tensor, so all tensors start with the same prefix of values (correlated noise). Here the
  tensor name is part of the key, so tensors get unrelated streams.
* Their seeds are drawn at random per iteration (``randint``), which can collide; here members
  are identified by index and keys are a hash of the full tuple (63 bits), so two distinct
  tuples collide with probability about 2**-63.
* OpenAI ES (Salimans et al. 2017, arXiv 1703.03864) slices a shared noise table; that needs
  ~1 GB per process and its slices overlap. Keyed generation needs no table.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping, Sequence

import torch

# The callable estimators take: (direction, tensor name, shape) -> noise of that shape.
NoiseFn = Callable[[int, str, torch.Size], torch.Tensor]


@dataclass(frozen=True)
class Member:
    """One population member: row ``index`` of ``rewards_N_P`` is the fitness of
    ``theta + sign * sigma * eps[direction]``."""

    index: int
    direction: int
    sign: int


def _int_bytes(x: int, what: str) -> bytes:
    if not isinstance(x, int) or isinstance(x, bool):
        raise ValueError(f"{what} must be an int, got {x!r}")
    # Fixed width keeps the encoding of the tuple injective (no "1,23" vs "12,3" clash).
    try:
        return x.to_bytes(16, "little", signed=True)
    except OverflowError:
        raise ValueError(f"{what} must fit in 127 bits, got {x!r}") from None


def noise_key(run_seed: int, iteration: int, direction: int, name: str) -> int:
    """The 63-bit generator seed of direction ``direction``'s noise for tensor ``name``.

    blake2b (personalised ``es-llm/noise/v1``) over fixed-width encodings of the three ints
    followed by the UTF-8 name. Python's ``hash`` is salted per process and cannot be used;
    ``seed + offset`` schemes (Qiu et al.'s i.i.d. variant) make keys of neighbouring
    iterations or members overlap. The result is below 2**63 so it is a valid seed for
    ``torch.Generator.manual_seed`` and for signed 64-bit fields in ledgers and databases.
    """
    parts = [_int_bytes(run_seed, "run_seed"), _int_bytes(iteration, "iteration"),
             _int_bytes(direction, "direction")]
    if iteration < 0 or direction < 0:
        raise ValueError(f"iteration and direction must be >= 0, got {iteration}, {direction}")
    if not isinstance(name, str):
        raise ValueError(f"name must be a str, got {name!r}")
    h = hashlib.blake2b(digest_size=8, person=b"es-llm/noise/v1")
    for part in parts:
        h.update(part)
    h.update(name.encode("utf-8"))
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def gaussian(key: int, shape: Sequence[int], *, dtype: torch.dtype = torch.float32,
             device: str = "cpu") -> torch.Tensor:
    """Standard normal noise of ``shape``, a pure function of ``(key, device type)``.

    Drawn from a fresh ``torch.Generator`` on ``device`` seeded with ``key`` (torch's global
    RNG is never touched). ``device="cpu"`` (the default) is the portable choice: the same key
    gives the same values on every machine, and callers move the tensor with ``.to(device)``.
    ``device="cuda"`` draws with the accelerator's own generator (Philox), which is orders of
    magnitude faster there but gives *different* values from the CPU stream, so noise, and a
    ledger's replay, then agree only between CUDA devices. Values are always drawn in float32
    and then cast, so a bf16 or fp64 copy of a parameter sees the rounding of the same fp32
    noise rather than a different stream.

    Caveat (measured with torch 2.13): torch's CPU ``randn`` picks its kernel by CPU
    capability. The AVX2 and AVX512 kernels agree bitwise, the generic kernel (non-x86, or
    ``ATEN_CPU_CAPABILITY=default``) differs in the last bits (|diff| < 2e-6). Ranks of one job
    run the same build on the same hardware, so they agree; rebuilding weights from a
    ledger on another architecture gives the same weights only up to that rounding.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(key)
    eps = torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)
    return eps if dtype == torch.float32 else eps.to(dtype)


NOISE_DEVICES = ("cpu", "cuda")


def check_noise_device(device: str) -> None:
    """Raise ValueError unless ``device`` is a noise device this machine has."""
    if device not in NOISE_DEVICES:
        raise ValueError(f"unknown noise device {device!r}; valid choices are: "
                         f"{', '.join(NOISE_DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("noise device 'cuda' was asked for but torch sees no CUDA device; "
                         "use 'cpu'")


def keyed_noise(run_seed: int, iteration: int, *, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> NoiseFn:
    """The ``noise_for(direction, name, shape)`` callable of one iteration, for estimators."""
    return partial(_keyed, run_seed, iteration, dtype, device)


def _keyed(run_seed: int, iteration: int, dtype: torch.dtype, device: str, direction: int,
           name: str, shape: Sequence[int]) -> torch.Tensor:
    return gaussian(noise_key(run_seed, iteration, direction, name), shape, dtype=dtype,
                    device=device)


def draw_direction(noise_for: NoiseFn, direction: int, shapes: Mapping[str, Sequence[int]],
                   threads: int = 1) -> dict[str, torch.Tensor]:
    """``{name: noise_for(direction, name, shape)}`` for every tensor of ``shapes``, drawn on
    ``threads`` threads at once.

    torch's CPU generator draws on one core (drawing a Qwen2.5-0.5B-sized direction takes
    seconds), but each tensor has a generator of its own (``gaussian``) and torch releases
    the GIL while it draws, so tensors drawn side by side on free cores give the very values
    drawn one after another, in less time. Tensors are handed out in ``shapes``' order.
    """
    if threads <= 1 or len(shapes) <= 1:
        return {n: noise_for(direction, n, s) for n, s in shapes.items()}
    with ThreadPoolExecutor(min(threads, len(shapes))) as pool:
        drawn = pool.map(lambda item: noise_for(direction, *item), shapes.items())
        return dict(zip(shapes, drawn))


def direction_and_sign(n: int, antithetic: bool) -> tuple[int, int]:
    """Member ``n``'s noise direction and sign.

    Antithetic (mirrored) sampling pairs members 2j and 2j+1 on direction j with signs +1
    and -1 (Salimans et al. 2017; evotorch ``SymmetricSeparableGaussian``; EGGROLL's
    ``thread_id // 2``). Without it member n uses direction n with sign +1.
    """
    if n < 0:
        raise ValueError(f"member index must be >= 0, got {n}")
    if antithetic:
        return n // 2, 1 - 2 * (n % 2)
    return n, 1


def population(N: int, antithetic: bool) -> tuple[Member, ...]:
    """The ``N`` members of an iteration, in row order of ``rewards_N_P``.

    Raises ValueError if ``N < 1``, or if ``N`` is odd with antithetic sampling (a lone ``+eps``
    member would have no mirror and bias the paired estimator).
    """
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise ValueError(f"population size N must be a positive int, got {N!r}")
    if antithetic and N % 2:
        raise ValueError(f"antithetic sampling needs an even population size, got N={N}")
    return tuple(Member(n, *direction_and_sign(n, antithetic)) for n in range(N))
