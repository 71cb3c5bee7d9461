"""The trainers' guard against NaN and inf.

Every trainer (ES; the GRPO-family loop, which also runs OPD and the diffusion-LM methods;
SFT) refuses a starting model with non-finite weights, then checks its loss, gradient norm,
sampling distribution and update at every step. At the first non-finite value it stops:

* the step's row of ``metrics.jsonl`` is written with ``null`` for each non-finite value and
  their keys listed under ``nonfinite`` (JSON has no NaN; no row of any log holds one);
* no checkpoint of the diverged weights is written, and the checkpoints saved before stay
  (for ES, the ledger ends at the last finite iteration, so ``--resume`` rebuilds it);
* the command ends with one paragraph naming the step, the quantity and its value.

The exit status says whose doing it was. A setting's (2): the update itself is non-finite,
or the value appears once updates have moved the weights away from the (finite) start, so a
step size let them run away. Not a setting's (1): a non-finite value from the finite
starting weights before any update (the loss or the model failed numerically), or a
non-finite reward (a task's rewards are numbers by contract).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import torch

from es_llm.errors import BadInput, NonFinite

# The key of a metrics row that lists the keys whose values were NaN or inf (written null).
NONFINITE_KEY = "nonfinite"


def finite_row(row: dict) -> dict:
    """``row`` with every non-finite float replaced by None and their keys listed under
    ``nonfinite``; ``row`` itself when every value is finite."""
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return row
    return {**{k: None if k in bad else v for k, v in row.items()}, NONFINITE_KEY: bad}


class Diverged(Exception):
    """Raised inside a training step at its first non-finite guarded value: ``quantity``
    (loss, gradient norm, update, sampling distribution, reward), its metrics ``key`` and
    ``value``, whether the weights had already been ``moved`` by an update, and the step's
    ``metrics`` so far."""

    def __init__(self, quantity: str, key: str, value: float, moved: bool,
                 metrics: dict | None = None):
        super().__init__(f"non-finite {quantity}: {value}")
        self.quantity, self.key, self.value, self.moved = quantity, key, value, moved
        self.metrics = dict(metrics or {})

    @property
    def by_setting(self) -> bool:
        return self.quantity != "reward" and (self.moved or self.quantity == "update")

    def row(self, **head) -> dict:
        """The step's metrics row: ``head`` (its step), what it measured before it stopped,
        the value that stopped it (null, listed under ``nonfinite``) and ``diverged``."""
        return finite_row({**head, **self.metrics, self.key: self.value,
                           "diverged": self.quantity})


def check(quantity: str, key: str, value: float, moved: bool,
          metrics: dict | None = None) -> None:
    """Raise ``Diverged`` unless ``value`` is finite."""
    if not math.isfinite(value):
        raise Diverged(quantity, key, value, moved, metrics)


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite (one host sync for all of them)."""
    flags = [t.detach().isfinite().all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def check_update(params: Iterable[torch.Tensor], key: str, metrics: dict | None = None) -> None:
    """Raise ``Diverged`` (quantity ``update``, the first non-finite weight as its value under
    ``key``) when an optimizer step left any weight non-finite."""
    params = [p.detach() for p in params]
    if all_finite(params):
        return
    value = next(float(p[~p.isfinite()].flatten()[0]) for p in params
                 if not bool(p.isfinite().all()))
    raise Diverged("update", key, value, True, metrics)


def check_start(named: Iterable[tuple[str, torch.Tensor]], model: str) -> None:
    """BadInput when the starting model already holds NaN or inf weights: a trainer would
    only carry them along, and the guard would take them for a failure of its own."""
    named = list(named)
    if all_finite(t for _, t in named):
        return
    bad = [n for n, t in named if not bool(t.detach().isfinite().all())]
    raise BadInput(f"the model {model!r} has NaN or inf weights in {len(bad)} tensor(s) (first: "
                   f"{bad[0]}), so nothing trained from it can be finite; start from a model "
                   f"whose weights are all numbers (e.g. an earlier checkpoint).")


def last_checkpoint(out: Path) -> Path | None:
    """The ``checkpoints/step_<N>`` folder of a run with the largest N, if any."""
    steps = [(int(p.name.removeprefix("step_")), p) for p in (out / "checkpoints").glob("step_*")
             if p.name.removeprefix("step_").isdigit() and (p / "config.json").is_file()]
    return max(steps)[1] if steps else None


def stop_error(exc: Diverged, unit: str, step: int, advice: str, out: Path) -> NonFinite:
    """The one-paragraph error that ends a diverged run (see the module docstring)."""
    kept = last_checkpoint(out)
    kept_text = (f"the last finite checkpoint, {str(kept)!r}, is kept" if kept is not None
                 else "no checkpoint had been saved before it, and none of the diverged "
                      "weights is written")
    if exc.by_setting:
        why = (f"The weights {'had been moved by earlier updates' if exc.moved else 'were moved'}"
               f" until they ran away: the step size is too large for this model. {advice}, "
               f"and start a new run in a new --out.")
    elif exc.quantity == "reward":
        why = ("A task's rewards are numbers by contract, so this is a fault of the task's "
               "scoring; please report it with the run's config.yaml.")
    else:
        why = ("The starting weights were finite and no update had moved them, so no step size "
               "caused it: the loss or the model failed numerically; please report it with the "
               "run's config.yaml.")
    return NonFinite(f"the run stopped at {unit} {step}, where the {exc.quantity} came out "
                     f"{exc.value}. "
                     f"{why} {kept_text[0].upper()}{kept_text[1:]}; metrics.jsonl records "
                     f"{unit} {step} with null for each non-finite value (listed under "
                     f"'{NONFINITE_KEY}').", status=2 if exc.by_setting else 1)
