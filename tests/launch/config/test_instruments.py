"""Instrument settings are dataclasses built by the one typed loader (config.loader.build)."""

from __future__ import annotations

import dataclasses

import pytest
from normlab.launch.config import load_config
from normlab.launch.config.instruments import (
    NoSettings,
    SpikePolicySettings,
    checked_settings,
    settings_class,
)
from normlab.launch.config.loader import find_recipe
from normlab.launch.errors import ConfigError
from normlab.launch.registry import INSTRUMENT_SETTINGS, INSTRUMENTS


def test_every_settings_entry_names_a_registered_instrument_and_a_frozen_dataclass() -> None:
    assert set(INSTRUMENT_SETTINGS) <= set(INSTRUMENTS)
    for name in INSTRUMENTS:
        cls = settings_class(name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert checked_settings(name, True) == cls()  # defaults construct and pass their own rule
    assert settings_class("activations") is NoSettings


def test_values_are_typed_and_defaults_filled() -> None:
    s = checked_settings("spike_policy", {"window": 50, "k": 3, "rollback": False})
    assert s == SpikePolicySettings(window=50, k=3.0, max_bad_steps=5, rollback=False)
    assert isinstance(s.k, float)  # an int given for a float field is converted
    assert checked_settings("spike_policy", s) is s  # an instance passes through
    assert checked_settings("fp16_clamp", {"mode": False}).mode == "off"  # YAML 1.1's bare `off`


BAD = [
    ({"spike_score": {"windw": 3}}, "unknown key 'instruments.spike_score.windw' (did you mean 'instruments.spike_score.window'?)"),  # noqa: E501
    ({"spike_score": {"k": "big"}}, "instruments.spike_score.k must be a number, got 'big'"),
    ({"spike_policy": {"rollback": 1}}, "instruments.spike_policy.rollback must be of type bool, got 1"),  # noqa: E501
    ({"update_spikes": {"threshold": 0.5}}, "instruments.update_spikes needs window >= 1 and threshold > 1, got 100, 0.5"),  # noqa: E501
    ({"attention_logits": {"mode": "fast"}}, "instruments.attention_logits.mode must be one of 'exact', 'lse_bound', got 'fast'"),  # noqa: E501
    ({"activations": {"every": 2}}, "unknown key 'instruments.activations.every'"),
    ({"qk_gains": 3}, "instruments.qk_gains must be a mapping of settings, true or false, got 3"),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize(("section", "line"), BAD)
def test_load_config_refuses_bad_instrument_settings_in_one_line(section: dict, line: str) -> None:
    """`instruments:` is checked when the recipe loads (validate, submit), like every section."""
    overrides = [f"instruments.{name}={value!r}" for name, value in section.items()]
    overrides = [o.replace("'", '"') for o in overrides]
    with pytest.raises(ConfigError) as err:
        load_config(find_recipe("pre"), overrides)
    assert str(err.value).startswith(line)
    assert "\n" not in str(err.value)
