"""The sections of a comparison: every part of ``es-llm compare``'s report, optional or not,
is one registered ``Section`` written in its own module, with its parts side by side:

- ``enabled(cfg)``: whether this comparison has the section (from the config alone);
- ``check(CheckInput)``: its input check, run before anything is sampled or written; what it
  returns reaches its compute as ``SectionInput.checked`` (e.g. a file it already parsed);
- ``compute(SectionInput)``: its numbers, a typed result whose ``to_json()`` gives the
  comparison.json entries it writes;
- ``figures(comp, folder)``: its PNGs, drawn from the comparison dict alone (so a figure
  cannot show a number comparison.json does not hold), as ``{figure key: file name}``;
- ``blocks(comp, figures)``: its part of the report (``es_llm.report`` blocks).

``es_llm.compare.run`` checks, computes, draws and writes the enabled sections in the order
of their ``place``, which is the report's order (places are multiples of 10, so a new
section fits between two others without moving them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Protocol

import numpy as np

from es_llm.compare.config import CompareConfig
from es_llm.compare.samples import SampleSet
from es_llm.errors import BadInput
from es_llm.report import Block
from populations.registry import Registry


class Source(NamedTuple):
    """One compared model as given: its name, its path (a model folder or samples) and the
    training run it came from, when known."""

    name: str
    path: Path
    run: Path | None


@dataclass(frozen=True)
class CheckInput:
    """What a section's check may read: the config, every source, and the sources given as
    sample files, already loaded and checked against each other."""

    cfg: CompareConfig
    sources: tuple[Source, ...]
    loaded: Mapping[str, SampleSet]


@dataclass(frozen=True)
class SectionInput:
    """What a section's compute may read."""

    cfg: CompareConfig
    sources: tuple[Source, ...]
    # Every model's samples, aligned (the same problems in the same order).
    sets: tuple[SampleSet, ...]
    # The comparison's output folder; a section that samples writes under out/samples.
    out: Path
    progress: bool
    echo: Callable[[str], None]
    # What this section's check returned.
    checked: object = None

    def rng(self) -> np.random.Generator:
        """A fresh stream from the comparison's metrics seed: every section draws its own,
        so a section added or switched on moves no other section's numbers."""
        return np.random.default_rng(self.cfg.metrics_seed)


class Result(Protocol):
    def to_json(self) -> dict:
        """The comparison.json entries of this result, by key."""


def fields_dict(result) -> dict:
    """A dataclass result's fields by name, the values as they are (``dataclasses.asdict``
    would copy every nested value)."""
    return {f.name: getattr(result, f.name) for f in fields(result)}


def always(cfg: CompareConfig) -> bool:
    return True


def model_folder(inp: CheckInput, source: Source, needs: str) -> Path:
    """The model folder behind a compared model: its path when that is a model folder, else
    the folder its samples record. BadInput when there is none; ``needs`` says what runs the
    model's weights (e.g. "--blind-spot runs")."""
    name, path, _ = source
    loaded = inp.loaded.get(name)
    folder = path if (path / "config.json").is_file() else (
        Path(loaded.model) if loaded is not None and loaded.model else None)
    if folder is None or not (folder / "config.json").is_file():
        raise BadInput(f"{needs} {name}'s model, but {path} records no model folder; give the "
                       f"model folder (or an eval folder whose config.yaml names one).")
    return folder


@dataclass(frozen=True)
class Section:
    # Position in the report (and in checking and computing), unique among sections.
    place: int
    enabled: Callable[[CompareConfig], bool]
    blocks: Callable[[dict, dict[str, str]], list[Block]]
    check: Callable[[CheckInput], object] | None = None
    # None: the section reports numbers another section computes.
    compute: Callable[[SectionInput], Result] | None = None
    figures: Callable[[dict, Path], dict[str, str]] | None = None


SECTIONS: Registry[Section] = Registry("comparison section")


def sections(cfg: CompareConfig) -> list[tuple[str, Section]]:
    """The sections of this comparison, ``(name, section)`` in the order of their places;
    ValueError when two registered sections claim one place."""
    found = sorted(((name, SECTIONS.get(name)) for name in SECTIONS), key=lambda x: x[1].place)
    places = [s.place for _, s in found]
    clash = sorted({p for p in places if places.count(p) > 1})
    if clash:
        raise ValueError(f"comparison sections share place(s) {clash}: "
                         f"{[n for n, s in found if s.place in clash]}")
    return [(name, s) for name, s in found if s.enabled(cfg)]
