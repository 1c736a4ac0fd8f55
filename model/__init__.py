"""normlab's decoder: every norm placement behind one config switch (see SCIENCE.md).

The names below load on first use (PEP 562), so `normlab.model.config` and
`normlab.model.presets` (configs, presets, the analytic parameter count) import without torch:
commands that only read a recipe (`validate`, `plan`, `--help`) stay instant.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ModelConfig
    from .loss import lm_loss
    from .presets import PRESETS, count_params
    from .transformer import Block, Transformer

# public name -> the submodule that defines it
_HOMES = {
    "Block": "transformer",
    "ModelConfig": "config",
    "PRESETS": "presets",
    "Transformer": "transformer",
    "count_params": "presets",
    "lm_loss": "loss",
}

__all__ = ["Block", "ModelConfig", "PRESETS", "Transformer", "count_params", "lm_loss"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
