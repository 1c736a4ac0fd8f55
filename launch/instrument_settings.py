"""The settings of every instrument in a recipe's `instruments:` section, checked without torch.

The instruments are torch modules; their settings are plain values. Each instrument's constructor
checks its settings here, and preflight checks a whole section here without importing any
instrument, so `submit --dry-run` refuses what `train` would refuse without loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from normlab.launch.config.loader import suggest
from normlab.launch.errors import ConfigError
from normlab.launch.metric_keys import UPDATE_SPIKE_DEFAULTS
from normlab.launch.registry import INSTRUMENTS

ATTENTION_MODES = ("exact", "lse_bound")  # instruments.attention.MODES (a test holds them equal)
POLICY_DEFAULTS = {
    "window": 1000, "k": 7.0, "max_bad_steps": 5, "rollback": True, "max_rollbacks": 10,
}  # fmt: skip


def settings_of(settings: Any, allowed: dict[str, Any], name: str) -> dict[str, Any]:
    """Merge an instrument's settings over its defaults; unknown keys are a ConfigError."""
    if settings is True or settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise ConfigError(f"instruments.{name} must be a mapping or true/false, got {settings!r}")
    for key in settings:
        if key not in allowed:
            hint = suggest(str(key), list(allowed), f"instruments.{name}.")
            raise ConfigError(f"unknown key 'instruments.{name}.{key}'{hint}")
    out = dict(allowed)
    for key, value in settings.items():
        out[key] = _typed(value, allowed[key], f"instruments.{name}.{key}")
    return out


def _typed(value: Any, default: Any, where: str) -> Any:
    """`value` as the type of `default`: bools are no numbers, numbers must be finite."""
    if not isinstance(default, bool | int | float | str):
        return value
    kind = type(default)
    fits = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if isinstance(value, bool) != (kind is bool) or not fits:
        raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return kind(value)


def _attention_logits(settings: Any) -> dict[str, Any]:
    s = settings_of(settings, {"mode": "exact"}, "attention_logits")
    if s["mode"] not in ATTENTION_MODES:
        raise ConfigError(
            f"instruments.attention_logits.mode must be one of {sorted(ATTENTION_MODES)}, got "
            f"{s['mode']!r}"
        )
    return s


def _spike_score(settings: Any) -> dict[str, Any]:
    s = settings_of(settings, {"window": 1000, "k": 7.0}, "spike_score")
    if s["window"] < 1 or s["k"] <= 0:
        raise ConfigError(
            f"instruments.spike_score needs window >= 1 and k > 0, got {s['window']}, {s['k']}"
        )
    return s


def _update_spikes(settings: Any) -> dict[str, Any]:
    s = settings_of(settings, UPDATE_SPIKE_DEFAULTS, "update_spikes")
    if s["window"] < 1 or s["threshold"] <= 1:
        raise ConfigError(
            "instruments.update_spikes needs window >= 1 and threshold > 1, got "
            f"{s['window']}, {s['threshold']}"
        )
    return s


def _spike_policy(settings: Any) -> dict[str, Any]:
    s = settings_of(settings, POLICY_DEFAULTS, "spike_policy")
    if s["window"] < 2 or s["k"] <= 0 or s["max_bad_steps"] < 1 or s["max_rollbacks"] < 0:
        raise ConfigError(
            "instruments.spike_policy needs window >= 2, k > 0, max_bad_steps >= 1 and "
            f"max_rollbacks >= 0, got {s['window']}, {s['k']}, {s['max_bad_steps']}, "
            f"{s['max_rollbacks']}"
        )
    return s


def _fp16_clamp(settings: Any) -> dict[str, Any]:
    if isinstance(settings, dict) and isinstance(settings.get("mode"), bool):
        # YAML 1.1 reads a bare `mode: on` / `mode: off` as a boolean
        settings = {**settings, "mode": "on" if settings["mode"] else "off"}
    s = settings_of(settings, {"mode": "auto"}, "fp16_clamp")
    if s["mode"] not in ("auto", "on", "off"):
        raise ConfigError(
            f"instruments.fp16_clamp.mode must be 'auto', 'on' or 'off', got {s['mode']!r}"
        )
    return s


# instruments.early_warning (SCIENCE.md 23.4): the signals it can watch every step without a
# logging instrument, and the actions; clip_update needs the whole update on one device
WARNING_SIGNALS = ("loss", "grad_norm")
WARNING_ACTIONS = ("checkpoint", "backoff", "rollback", "clip_update")
WARNING_DEFAULTS = {
    "signals": ["grad_norm"], "k": 6.0, "window": 100, "action": "checkpoint",
    "backoff": 0.5, "rewarm_steps": 100, "max_rollbacks": 5, "clip_sigma": 3.0,
    "clip_window": 128,
}  # fmt: skip
WARNING_ENGINES = {"clip_update": ("single",)}  # actions some engines cannot do


def _early_warning(settings: Any) -> dict[str, Any]:
    s = settings_of(settings, WARNING_DEFAULTS, "early_warning")
    where = "instruments.early_warning"
    signals = s["signals"]
    if isinstance(signals, str):
        signals = s["signals"] = [signals]
    if not isinstance(signals, list) or not signals:
        raise ConfigError(f"{where}.signals must be a list of {list(WARNING_SIGNALS)}")
    for sig in signals:
        if sig not in WARNING_SIGNALS:
            raise ConfigError(
                f"{where}.signals: unknown signal {sig!r}; allowed: {', '.join(WARNING_SIGNALS)}"
            )
    if s["action"] not in WARNING_ACTIONS:
        raise ConfigError(
            f"{where}.action must be one of {', '.join(WARNING_ACTIONS)}, got {s['action']!r}"
        )
    for key in ("k", "clip_sigma"):
        if s[key] <= 0:
            raise ConfigError(f"{where}.{key} must be a positive number, got {s[key]!r}")
    if not 0 < s["backoff"] < 1:
        raise ConfigError(f"{where}.backoff must lie in (0, 1), got {s['backoff']!r}")
    for key, low in (("window", 2), ("clip_window", 2), ("rewarm_steps", 0), ("max_rollbacks", 0)):
        if s[key] < low:
            raise ConfigError(f"{where}.{key} must be an integer >= {low}, got {s[key]!r}")
    return s


def check_warning_engine(section: dict[str, Any], engine: str) -> None:
    """The early_warning action this engine cannot do: one line naming the engines that can."""
    settings = section.get("early_warning")
    if settings is None or settings is False:
        return
    action = _early_warning(settings)["action"]
    engines = WARNING_ENGINES.get(action)
    if engines is not None and engine not in engines:
        raise ConfigError(
            f"instruments.early_warning.action {action!r} cannot run on engine {engine!r}; "
            f"allowed engines: {', '.join(engines)} (other actions: "
            f"{', '.join(a for a in WARNING_ACTIONS if a not in WARNING_ENGINES)})"
        )


# instruments with settings; every other one takes none (`true`, or an empty mapping)
CHECKS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "attention_logits": _attention_logits,
    "spike_score": _spike_score,
    "update_spikes": _update_spikes,
    "spike_policy": _spike_policy,
    "fp16_clamp": _fp16_clamp,
    "early_warning": _early_warning,
}


def checked_settings(name: str, settings: Any) -> dict[str, Any]:
    """Instrument `name`'s settings over its defaults, or the ConfigError naming the bad one."""
    check = CHECKS.get(name)
    return check(settings) if check else settings_of(settings, {}, name)


def check_instruments(section: dict[str, Any]) -> None:
    """What building the callbacks of `instruments:` would refuse: an unknown name (with the
    closest one) or bad settings; an entry set to false/null is switched off."""
    for name, settings in section.items():
        if name not in INSTRUMENTS:
            hint = suggest(name, list(INSTRUMENTS), "instruments.")
            raise ConfigError(f"unknown instrument 'instruments.{name}'{hint}")
        if settings is not False and settings is not None:
            checked_settings(name, settings)
