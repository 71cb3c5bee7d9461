"""Config loading: YAML round trip, overrides, strict errors for unknown keys and types."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml

from es_llm.config import apply_overrides, dump_yaml, from_dict, load_config, to_dict
from es_llm.errors import BadInput


@dataclass(frozen=True)
class Inner:
    lr: float = 0.1
    tiers: tuple[int, ...] = (2, 3)
    name: str | None = None


@dataclass(frozen=True)
class Outer:
    steps: int = 10
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_round_trip_through_yaml():
    cfg = Outer(steps=3, flag=True, inner=Inner(lr=0.5, tiers=(4,), name="x"))
    again = from_dict(Outer, yaml.safe_load(dump_yaml(cfg)))
    assert again == cfg


def test_layers_compose_in_order(tmp_path):
    # defaults < base (preset) < file < flags < overrides
    f = tmp_path / "c.yaml"
    f.write_text("steps: 5\ninner:\n  lr: 0.2\n  name: from-file\n")
    cfg = load_config(Outer, base={"steps": 1, "flag": True, "inner": {"tiers": [9]}}, path=f,
                      flags={"inner": {"name": "from-flag"}},
                      overrides=["inner.lr=0.3", "inner.tiers=[1,2,3]"])
    assert cfg == Outer(steps=5, flag=True, inner=Inner(lr=0.3, tiers=(1, 2, 3), name="from-flag"))


def test_int_is_accepted_for_float_but_not_the_reverse():
    assert from_dict(Inner, {"lr": 1}).lr == 1.0
    with pytest.raises(BadInput, match="'steps' must be an integer"):
        from_dict(Outer, {"steps": 1.5})


@pytest.mark.parametrize("data, message", [
    ({"stepz": 1}, r"unknown config key 'stepz'; valid keys here are: steps, flag, inner"),
    ({"inner": {"lrr": 1}}, r"'inner.lrr'; valid keys here are: inner.lr, inner.tiers"),
    ({"flag": "yes"}, r"'flag' must be true or false"),
    ({"inner": 3}, r"'inner' must be a mapping"),
    ({"inner": {"tiers": 3}}, r"'inner.tiers' must be a list"),
])
def test_bad_configs_name_the_problem(data, message):
    with pytest.raises(BadInput, match=message):
        from_dict(Outer, data)


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(BadInput, match="key=value"):
        apply_overrides({}, ["steps"])
    with pytest.raises(BadInput, match="does not exist"):
        load_config(Outer, path=tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(BadInput, match="mapping at the top level"):
        load_config(Outer, path=bad)


def test_to_dict_is_plain_data():
    assert to_dict(Outer()) == {"steps": 10, "flag": False,
                                "inner": {"lr": 0.1, "tiers": [2, 3], "name": None}}


def test_exponent_floats_without_a_dot_are_numbers():
    # YAML 1.1 reads "1e-3" as a string; as a float field's value it is meant as a number.
    from es_llm.es.config import ESRunConfig
    cfg = load_config(ESRunConfig, overrides=["es.lr=1e-3", "es.sigma=2E-4"])
    assert cfg.es.lr == 1e-3 and cfg.es.sigma == 2e-4
    with pytest.raises(BadInput, match="must be a number"):
        load_config(ESRunConfig, overrides=["es.lr=fast"])


@pytest.mark.parametrize("bad, key", [
    (dict(population=3, antithetic=True, sigma=0.0), "es.population"),
    (dict(sigma=0.0), "es.sigma"),
    (dict(optimizer="rmsprop"), "es.optimizer"),
    (dict(anchor_decay=-1.0), "es.anchor_decay"),
    (dict(shaping="pair_diff"), "es.shaping"),
])
def test_the_loader_names_the_key_of_a_population_maths_error(bad, key):
    # The ES section is populations.es.ESConfig, which knows nothing of config files and
    # raises ValueError naming its field; the loader turns it into BadInput naming the key.
    from es_llm.es.config import ESRunConfig
    from populations.es import ESConfig

    with pytest.raises(ValueError):
        ESConfig(**bad)
    overrides = [f"es.{k}={yaml.safe_dump(v).splitlines()[0]}" for k, v in bad.items()]
    with pytest.raises(BadInput, match=f"^config key '{key}': "):
        load_config(ESRunConfig, overrides=overrides)


@dataclass(frozen=True)
class Maths:
    """A model-free config that validates with a plain ValueError."""

    k: int = 1

    def __post_init__(self):
        if self.k < 1:
            raise ValueError("k must be positive")


@dataclass(frozen=True)
class WithMaths:
    maths: Maths = field(default_factory=Maths)


def test_a_value_error_without_a_field_names_the_section():
    with pytest.raises(BadInput, match="in config section 'maths': k must be positive"):
        from_dict(WithMaths, {"maths": {"k": 0}})
