"""The recipe's `model:` section (written out in launch/config/schema.py) mirrors ModelConfig."""

from __future__ import annotations

import dataclasses
import typing

from normlab.launch.config.schema import ModelSection
from normlab.model.config import ModelConfig


def test_model_section_has_every_model_config_field_optional_plus_preset() -> None:
    section = typing.get_type_hints(ModelSection)
    model = typing.get_type_hints(ModelConfig)
    assert list(section) == ["preset", *model]  # same order: the saved config reads the same
    for name, hint in model.items():
        assert section[name] == hint | None, name
        assert getattr(ModelSection(), name) is None, name


def test_to_model_config_takes_only_the_fields_the_recipe_set() -> None:
    section = ModelSection(preset="tiny", placement="peri", d_model=96, n_heads=3)
    cfg = section.to_model_config()
    default = ModelConfig()
    assert (cfg.placement, cfg.d_model, cfg.n_heads) == ("peri", 96, 3)
    unset = [f.name for f in dataclasses.fields(ModelConfig)]
    unset = [n for n in unset if n not in ("placement", "d_model", "n_heads", "n_kv_heads", "init")]
    assert all(getattr(cfg, n) == getattr(default, n) for n in unset)
    assert cfg.n_kv_heads == 3 and cfg.init == "gpt2"  # ModelConfig's own rules fill these
