"""The spike report card of `normlab compare`: per run, every way a step can go wrong, counted.

- spike score of the loss and of the gradient norm (OLMo 2, SCIENCE.md 8; the spike_score
  instrument), with the window used;
- update-norm spikes per block (the update_spikes instrument: a step's update norm at least
  `threshold` x the median of that block's previous updates): steps at which some block spiked,
  and per block the count and the largest ratio seen;
- steps the spike policy skipped and steps whose updates a rollback discarded, and their share of
  the run's steps ("steps lost");
- fp16: clamped blocks (fp16_clamp) and updates the loss scaler skipped; non-finite steps.

A value an instrument did not measure is '-', never 0.
"""

from __future__ import annotations

import math
from typing import Any

from normlab.launch.config.instruments import UpdateSpikesSettings
from normlab.launch.metric_keys import (
    FP16_CLAMPS,
    NONFINITE,
    ROLLBACKS,
    ROLLED_BACK,
    SCALER_SKIPS,
    SKIPPED,
    SPIKE_GRAD,
    SPIKE_LOSS,
    SPIKE_WINDOW,
    UPDATE_RATIO_MAX,
    UPDATE_SPIKE_STEPS,
    UPDATE_SPIKES,
    parse_block_key,
)
from normlab.launch.rundir.runs import Run
from rich.console import Console
from rich.table import Table

# key, header, format
CARD: list[tuple[str, str, str]] = [
    ("run", "run", ""),
    ("steps", "steps", "d"),
    ("spike_loss", "loss spike %", ".3f"),
    ("spike_grad", "grad spike %", ".3f"),
    ("spike_window", "window", "d"),
    ("update_threshold", "update spike at", ""),
    (UPDATE_SPIKE_STEPS, "update-spike steps", "d"),
    ("update_spikes_by_block", "update spikes by block (max ratio)", ""),
    ("skipped", "skipped", "d"),
    ("rollbacks", "rollbacks", "d"),
    ("rolled_back", "rolled back", "d"),
    ("lost_pct", "steps lost %", ".2f"),
    (FP16_CLAMPS, "fp16 clamps", "d"),
    (SCALER_SKIPS, "scaler skips", "d"),
    ("nonfinite", "non-finite", "d"),
]
CARD_NOTES = (
    "Spike report card. Loss/grad spike %: OLMo 2 spike score over every step so far (window in "
    "'window'). Update spikes: steps whose update norm ||W_after - W_before|| of a block is at "
    "least 'update spike at' (instruments.update_spikes.threshold) x the median of that block's "
    "previous window of updates; per block 'b<i> count (largest ratio)'. Steps lost: (skipped + "
    "rolled back) / steps. '-': not measured (the instrument was off)."
)


def _last(run: Run, key: str) -> float | None:
    for row in reversed(run.train):
        if key in row:
            return row[key]
    return None


def _per_block(run: Run) -> str | None:
    """'b0 0 (x1.9), b1 2 (x5.3)' from the last row that carries update-spike counts."""
    row = next((r for r in reversed(run.train) if UPDATE_SPIKE_STEPS in r), None)
    if row is None:
        return None
    counts: dict[int, float] = {}
    ratios: dict[int, float] = {}
    for key, value in row.items():
        parsed = parse_block_key(key)
        if parsed and parsed[2] is None and parsed[0] == UPDATE_SPIKES:
            counts[parsed[1]] = value
        elif parsed and parsed[2] is None and parsed[0] == UPDATE_RATIO_MAX:
            ratios[parsed[1]] = value
    return ", ".join(
        f"b{i} {int(counts[i])}" + (f" (x{ratios[i]:.3g})" if i in ratios else "")
        for i in sorted(counts)
    )


def report_card(run: Run, steps: int) -> dict[str, Any]:
    """One run's card (None where not measured); `steps` the run's last step."""
    skipped, rolled = _last(run, SKIPPED), _last(run, ROLLED_BACK)
    rollbacks = _last(run, ROLLBACKS)
    if rolled is None and rollbacks == 0:
        rolled = 0.0  # a policy that never rolled back discarded nothing
    lost = None
    if skipped is not None and rolled is not None and steps:
        lost = 100.0 * (skipped + rolled) / steps
    return {
        "run": run.label,
        "steps": steps,
        "spike_loss": _scored(_last(run, SPIKE_LOSS)),
        "spike_grad": _scored(_last(run, SPIKE_GRAD)),
        "spike_window": _last(run, SPIKE_WINDOW),
        "update_threshold": _threshold(run) if _last(run, UPDATE_SPIKE_STEPS) is not None else None,
        UPDATE_SPIKE_STEPS: _last(run, UPDATE_SPIKE_STEPS),
        "update_spikes_by_block": _per_block(run),
        "skipped": skipped,
        "rollbacks": rollbacks,
        "rolled_back": rolled,
        "lost_pct": lost,
        FP16_CLAMPS: _last(run, FP16_CLAMPS),
        SCALER_SKIPS: _last(run, SCALER_SKIPS),
        "nonfinite": _last(run, NONFINITE),
    }


def _threshold(run: Run) -> str:
    """'x4' from the run's instruments.update_spikes settings (or the default)."""
    settings = (run.config.get("instruments") or {}).get("update_spikes")
    value = settings.get("threshold") if isinstance(settings, dict) else None
    return f"x{value if value is not None else UpdateSpikesSettings().threshold:g}"


def _scored(score: float | None) -> float | None:
    return None if score is None or math.isnan(score) else score


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if spec == "d":
        return f"{int(value):d}"
    return format(value, spec) if spec else str(value)


def card_cells(cards: list[dict[str, Any]]) -> list[list[str]]:
    return [[_fmt(c[key], spec) for key, _, spec in CARD] for c in cards]


def card_markdown(cards: list[dict[str, Any]]) -> str:
    head = [h for _, h, _ in CARD]
    align = ["---" if not spec else "---:" for _, _, spec in CARD]
    lines = ["| " + " | ".join(r) + " |" for r in [head, align, *card_cells(cards)]]
    return "## Spike report card\n\n" + "\n".join(lines) + "\n\n" + CARD_NOTES + "\n"


def print_card(cards: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="spike report card", caption=CARD_NOTES, caption_justify="left")
    for _, header, spec in CARD:
        table.add_column(header, justify="left" if not spec else "right")
    for cells in card_cells(cards):
        table.add_row(*cells)
    console.print(table)
