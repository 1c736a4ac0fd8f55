"""The settings of every instrument in a recipe's `instruments:` section, checked without torch.

Each instrument's settings are a frozen dataclass (named by its entry in
launch.registry.INSTRUMENT_SETTINGS), built by the one typed loader (launch.config.loader.build):
unknown keys get the closest valid key, wrong types and values name their dotted key, and each
class's cross-field rule lives in its `__post_init__`. The instruments are torch modules; their
constructors call `checked_settings`, and preflight and the config checks call `check_instruments`
on a whole section without importing any instrument, so `validate` and `submit --dry-run` refuse
what `train` would refuse without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Literal

from normlab.launch.config.loader import build, suggest
from normlab.launch.errors import ConfigError
from normlab.launch.registry import INSTRUMENT_SETTINGS, INSTRUMENTS


@dataclass(frozen=True)
class NoSettings:
    """An instrument with nothing to set: `true` or an empty mapping switches it on."""


@dataclass(frozen=True)
class AttentionLogitsSettings:
    # exact: max |q.k| per layer from the logits; lse_bound: an upper bound without them
    mode: Literal["exact", "lse_bound"] = "exact"


@dataclass(frozen=True)
class SpikeScoreSettings:
    window: int = 1000  # steps in the rolling mean/std (OLMo 2 section 3.2)
    k: float = 7.0  # a value more than k std above the rolling mean is a spike

    def __post_init__(self) -> None:
        _need(self.window >= 1 and self.k > 0, "spike_score", "window >= 1 and k > 0",
              self.window, self.k)  # fmt: skip


@dataclass(frozen=True)
class UpdateSpikesSettings:
    window: int = 100  # steps in each block's running update-norm median
    threshold: float = 4.0  # an update norm this many times the median is a spike

    def __post_init__(self) -> None:
        _need(self.window >= 1 and self.threshold > 1, "update_spikes",
              "window >= 1 and threshold > 1", self.window, self.threshold)  # fmt: skip


@dataclass(frozen=True)
class SpikePolicySettings:
    window: int = 1000  # steps of loss and grad-norm history judged against
    k: float = 7.0  # a step more than k robust std above the window is bad
    max_bad_steps: int = 5  # bad steps in a row before a rollback
    rollback: bool = True  # False: only skip bad steps
    max_rollbacks: int = 10  # the run stops after this many

    def __post_init__(self) -> None:
        ok = self.window >= 2 and self.k > 0 and self.max_bad_steps >= 1
        _need(ok and self.max_rollbacks >= 0, "spike_policy",
              "window >= 2, k > 0, max_bad_steps >= 1 and max_rollbacks >= 0",
              self.window, self.k, self.max_bad_steps, self.max_rollbacks)  # fmt: skip


@dataclass(frozen=True)
class FP16ClampSettings:
    # auto: clamp only where activations run in fp16; on/off force it
    mode: Literal["auto", "on", "off"] = "auto"


def _need(ok: bool, name: str, rule: str, *values: Any) -> None:
    if not ok:
        got = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
        raise ConfigError(f"instruments.{name} needs {rule}, got {got}")


def settings_class(name: str) -> type:
    """The settings dataclass of instrument `name` (NoSettings for one without a registry entry)."""
    path = INSTRUMENT_SETTINGS.get(name)
    if path is None:
        return NoSettings
    module, attr = path.split(":")
    cls: type = getattr(import_module(module), attr)
    return cls


def checked_settings(name: str, settings: Any) -> Any:
    """Instrument `name`'s settings as its dataclass (defaults filled in), or the ConfigError
    naming the bad key; `true`/null mean the defaults, an instance passes through."""
    cls = settings_class(name)
    if isinstance(settings, cls):
        return settings
    if settings is True or settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise ConfigError(f"instruments.{name} must be a mapping or true/false, got {settings!r}")
    if cls is FP16ClampSettings and isinstance(settings.get("mode"), bool):
        # YAML 1.1 reads a bare `mode: on` / `mode: off` as a boolean
        settings = {**settings, "mode": "on" if settings["mode"] else "off"}
    return build(cls, settings, f"instruments.{name}.")


def check_instruments(section: dict[str, Any]) -> None:
    """What building the callbacks of `instruments:` would refuse: an unknown name (with the
    closest one) or bad settings; an entry set to false/null is switched off."""
    for name, settings in section.items():
        if name not in INSTRUMENTS:
            hint = suggest(str(name), list(INSTRUMENTS), "instruments.")
            raise ConfigError(f"unknown instrument 'instruments.{name}'{hint}")
        if settings is not False and settings is not None:
            checked_settings(name, settings)
