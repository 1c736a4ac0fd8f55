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

from dataclasses import dataclass, field
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


# instruments.early_warning (SCIENCE.md 23.4): the signals it can watch, each with the instrument
# that logs it (None: the trainer's own loss and grad norm, there every step). The names are those
# of launch.warning.signals.SIGNALS (a test holds the two equal); a per-block signal watches each
# block. A signal an instrument logs is watched on the steps it is logged (log steps).
WARNING_SIGNALS: dict[str, str | None] = {
    "loss": None,
    "grad_norm": None,
    "update_norm": "update_spikes",
    "update_ratio": "gradients",
    "block_grad_norm": "gradients",
    "max_logit": "attention_logits",
    "resid_rms": "activations",
    "logz_mean": "output_logits",
    "head_mean_norm": "output_logits",
    "head_norm": "adam_state",
    "adam_update_rms": "adam_state",
    "adam_m_norm": "adam_state",
    "qk_entropy": "qk_spectrum",
    "kurtosis": "kurtosis",
    "attn_entropy": "attn_entropy",
    "adam_v_norm": "adam_state",
    "eps_floor": "adam_state",
    "grad_mom_cos": "adam_state",
}
WARNING_ACTIONS = ("checkpoint", "backoff", "rollback", "clip_update")
WARNING_ENGINES = {"clip_update": ("single",)}  # actions some engines cannot do


@dataclass(frozen=True)
class EarlyWarningSettings:
    # what the detector watches: any signal `normlab warnings` scores (its instrument on)
    signals: list[str] = field(default_factory=lambda: ["grad_norm"])
    k: float = 6.0  # alarm when the robust z-score of log(signal) reaches k
    # level alarms, signal -> level on the signal's own scale (a ratio to the window median for
    # update_norm and adam_m_norm; at or below it for the entropies): `normlab warnings` tunes them
    levels: dict[str, float] = field(default_factory=dict)
    window: int = 100  # trailing steps of the robust z-score
    action: str = "checkpoint"  # checkpoint | backoff | rollback | clip_update
    backoff: float = 0.5  # backoff: the lr multiplier on alarm, then re-warmed
    rewarm_steps: int = 100  # backoff: steps back to the full lr
    # backoff from the newest checkpoint before the alarm (SCIENCE.md 23.4), or where it fired
    backoff_from: Literal["checkpoint", "alarm"] = "checkpoint"
    max_rollbacks: int = 5  # rollback (and backoff's return to a checkpoint): at most this many
    # rollback: batches (optimizer steps' worth) not trained on, those since the checkpoint
    # included (SCIENCE.md 23.4 after PaLM 5.1: skip the next 200)
    skip_batches: int = 200
    clip_sigma: float = 3.0  # clip_update (Levanter): clip at mean + sigma * std of past norms
    clip_window: int = 128  # clip_update: past update norms kept
    # backoff only, the placebo arm (SCIENCE.md 23.3, multiplicity and selection): > 0 takes the
    # same back-off once at this step, whatever the alarm says; alarms are counted, not acted on
    placebo_step: int = 0

    def __post_init__(self) -> None:
        where = "instruments.early_warning"
        allowed = ", ".join(WARNING_SIGNALS)
        if not self.signals:
            raise ConfigError(f"{where}.signals must be a list of {allowed}")
        for i, sig in enumerate(self.signals):
            if sig not in WARNING_SIGNALS:
                raise ConfigError(f"{where}.signals: unknown signal {sig!r}; allowed: {allowed}")
            if sig in self.signals[:i]:  # watched twice would feed the detector twice a step
                raise ConfigError(f"{where}.signals lists {sig!r} twice; list each signal once")
        for sig, level in self.levels.items():
            if sig not in self.signals:
                raise ConfigError(
                    f"{where}.levels.{sig}: not a watched signal; allowed: "
                    f"{', '.join(self.signals)} (add it to {where}.signals)"
                )
            if isinstance(level, bool) or not isinstance(level, int | float) or not level > 0:
                raise ConfigError(f"{where}.levels.{sig} must be a positive number, got {level!r}")
        if self.action not in WARNING_ACTIONS:
            raise ConfigError(
                f"{where}.action must be one of {', '.join(WARNING_ACTIONS)}, got {self.action!r}"
            )
        for key in ("k", "clip_sigma"):
            if getattr(self, key) <= 0:
                raise ConfigError(
                    f"{where}.{key} must be a positive number, got {getattr(self, key)!r}"
                )
        if self.placebo_step < 0 or (self.placebo_step and self.action != "backoff"):
            raise ConfigError(
                f"{where}.placebo_step is a step > 0 of action backoff only, got "
                f"{self.placebo_step!r} with action {self.action!r}"
            )
        if not 0 < self.backoff < 1:
            raise ConfigError(f"{where}.backoff must lie in (0, 1), got {self.backoff!r}")
        for key, low in (
            ("window", 2),
            ("clip_window", 2),
            ("rewarm_steps", 0),
            ("max_rollbacks", 0),
            ("skip_batches", 0),
        ):
            if getattr(self, key) < low:
                raise ConfigError(
                    f"{where}.{key} must be an integer >= {low}, got {getattr(self, key)!r}"
                )


def check_warning_engine(section: dict[str, Any], engine: str) -> None:
    """The early_warning action this engine cannot do: one line naming the engines that can."""
    settings = section.get("early_warning")
    if settings is None or settings is False:
        return
    action = checked_settings("early_warning", settings).action
    engines = WARNING_ENGINES.get(action)
    if engines is not None and engine not in engines:
        raise ConfigError(
            f"instruments.early_warning.action {action!r} cannot run on engine {engine!r}; "
            f"allowed engines: {', '.join(engines)} (other actions: "
            f"{', '.join(a for a in WARNING_ACTIONS if a not in WARNING_ENGINES)})"
        )


def check_warning_checkpoints(section: dict[str, Any], every: int) -> None:
    """A rollback (or a back-off from a checkpoint) needs checkpoints to return to."""
    settings = section.get("early_warning")
    if settings is None or settings is False or every > 0:
        return
    s = checked_settings("early_warning", settings)
    if s.action == "rollback" or (s.action == "backoff" and s.backoff_from == "checkpoint"):
        raise ConfigError(
            f"instruments.early_warning.action {s.action!r} returns to a checkpoint, but "
            f"checkpoint.every is 0 (none before the end); set checkpoint.every > 0"
            + (" or instruments.early_warning.backoff_from: alarm" if s.action == "backoff" else "")
        )


def check_warning_sources(section: dict[str, Any]) -> None:
    """Each watched signal's instrument must be on: one line naming the key to switch on."""
    settings = section.get("early_warning")
    if settings is None or settings is False:
        return
    for sig in checked_settings("early_warning", settings).signals:
        source = WARNING_SIGNALS[sig]
        if source is not None and section.get(source) in (None, False):
            raise ConfigError(
                f"instruments.early_warning.signals: {sig!r} is logged by instruments.{source}, "
                f"which is off; switch it on (instruments.{source}=true) or watch another signal"
            )


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
    if cls is EarlyWarningSettings and isinstance(settings.get("signals"), str):
        settings = {**settings, "signals": [settings["signals"]]}  # one signal, not in a list
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
    check_warning_sources(section)
