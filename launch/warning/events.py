"""The events of a run (SCIENCE.md 23.1), found in its logged loss series; no torch.

- E1 `nonfinite`: the first logged step with a NaN/inf loss, gradient norm (outside fp16, where
  an infinite gradient norm is a loss-scaler skip) or activation statistic.
- E2 `divergence`: the smoothed loss (median of the last 11 logged losses) rises more than
  `delta` = 0.5 nats above its running minimum and stays above it for `M` = 100 steps or to the
  end of the run; the event is the first step of that excursion. A non-finite loss ends the
  series (it is E1, and no excursion starts on it). normlab's reading of "to the end of the run"
  [choice]: a run that stopped early (diverged, killed, still running); in a run that completed
  its `total_steps` an excursion cut off by the last step is censored, not an event (else a
  noisy run's last two steps would count as a divergence).
- E3 `return_to_init`: after warm-up, the smoothed loss rises above `l_0 - 0.1`. normlab's reading
  [choice]: "return" needs a departure, so E3 is scored only once the smoothed loss has been below
  `l_0 - 0.1` (else a run with no warm-up would "return" at its first step).

Each kind is reported once, at its first step. The series is what metrics.jsonl holds: with
`log_every > 1` each value is the mean loss since the previous log, and the median runs over the
last 11 logged values (steps stay steps: M is counted in steps).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from normlab.launch.metric_keys import (
    ATTN_OUT,
    GRAD,
    INIT_LOSS,
    MLP_OUT,
    PRE_NORM,
    RESID,
    parse_block_key,
)

NONFINITE, DIVERGENCE, RETURN = "nonfinite", "divergence", "return_to_init"
CODES = {NONFINITE: "E1", DIVERGENCE: "E2", RETURN: "E3"}
SMOOTH, DELTA, HOLD, INIT_MARGIN = 11, 0.5, 100, 0.1
ACTIVATION_KINDS = (RESID, ATTN_OUT, MLP_OUT, PRE_NORM)  # the activation statistics E1 reads


@dataclass(frozen=True)
class Event:
    kind: str  # nonfinite | divergence | return_to_init
    step: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step}


def smoothed(losses: Sequence[float], width: int = SMOOTH) -> list[float]:
    """Median of the last `width` values (fewer at the start); +inf where the value itself is
    not finite, the median of the finite ones otherwise."""
    out = []
    for i, value in enumerate(losses):
        if not math.isfinite(value):
            out.append(math.inf)
            continue
        window = [v for v in losses[max(0, i - width + 1) : i + 1] if math.isfinite(v)]
        out.append(float(statistics.median(window)))
    return out


def first_nonfinite(rows: Sequence[dict[str, Any]], fp16: bool = False) -> int | None:
    """E1: the first row's step with a non-finite loss, grad norm or activation statistic."""
    for row in rows:
        keys = ["loss"] + ([] if fp16 else [GRAD])
        keys += [k for k in row if (p := parse_block_key(k)) and p[0] in ACTIVATION_KINDS]
        if any(_bad(row.get(k)) for k in keys):
            return int(row["step"])
    return None


def _number(value: Any) -> Any:
    """metrics.jsonl writes non-finite floats as 'nan'/'inf' strings: read them as floats."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _bad(value: Any) -> bool:
    return isinstance(value, int | float) and not math.isfinite(value)


def first_divergence(
    steps: Sequence[int],
    losses: Sequence[float],
    delta: float = DELTA,
    hold: int = HOLD,
    completed: bool = False,
) -> int | None:
    """E2: the first step of an excursion of the smoothed loss above its running minimum + delta
    that lasts `hold` steps, or to the end of the series when the run ended early (not
    `completed`)."""
    smooth = smoothed(losses)
    lowest = math.inf
    for i, value in enumerate(smooth):
        if not math.isfinite(value):
            return None  # a non-finite loss ends the run (E1), it starts no excursion
        level = lowest + delta
        if value > level and _stays_above(steps, smooth, i, level, hold, completed):
            return int(steps[i])
        lowest = min(lowest, value)
    return None


def _stays_above(
    steps: Sequence[int],
    smooth: Sequence[float],
    start: int,
    level: float,
    hold: int,
    completed: bool,
) -> bool:
    for j in range(start, len(smooth)):
        if steps[j] - steps[start] >= hold or not math.isfinite(smooth[j]):
            return True  # held, or held until the run ended non-finite
        if not smooth[j] > level:
            return False
    return not completed  # above to the end of a run that stopped early; censored otherwise


def first_return(
    steps: Sequence[int], losses: Sequence[float], init_loss: float, warmup_steps: int
) -> int | None:
    """E3: after warm-up, and after it had left, the smoothed loss back above init_loss - 0.1."""
    level, departed = init_loss - INIT_MARGIN, False
    for step, value in zip(steps, smoothed(losses), strict=True):
        if value <= level:
            departed = True
        elif departed and step > warmup_steps:
            return int(step)
    return None


def find_events(
    rows: Sequence[dict[str, Any]],
    warmup_steps: int = 0,
    init_loss: float | None = None,
    fp16: bool = False,
    total_steps: int | None = None,
) -> list[Event]:
    """Every event of a run's logged training rows (each with `step` and `loss`), by step.
    `init_loss` is l_0 (the init_loss instrument's measurement); without it, the first logged
    loss. `total_steps`: the run's configured length (a run logged to it has completed)."""
    rows = [{k: _number(v) for k, v in r.items()} for r in rows if "loss" in r]
    rows = [r for r in rows if isinstance(r["loss"], float)]
    if not rows:
        return []
    steps = [int(r["step"]) for r in rows]
    losses = [float(r["loss"]) for r in rows]
    l0 = init_loss if init_loss is not None and math.isfinite(init_loss) else losses[0]
    found = {
        NONFINITE: first_nonfinite(rows, fp16),
        DIVERGENCE: first_divergence(
            steps, losses, completed=total_steps is not None and steps[-1] >= total_steps
        ),
        RETURN: first_return(steps, losses, l0, warmup_steps) if math.isfinite(l0) else None,
    }
    return sorted(
        (Event(k, s) for k, s in found.items() if s is not None), key=lambda e: (e.step, e.kind)
    )


def run_events(
    rows: Sequence[dict[str, Any]], config: dict[str, Any], init_loss: float | None = None
) -> list[Event]:
    """find_events with the warm-up and precision a run's config (a mapping) names."""
    warmup = int((config.get("schedule") or {}).get("warmup_steps") or 0)
    fp16 = (config.get("precision") or {}).get("dtype") == "fp16"
    total = (config.get("training") or {}).get("steps")
    if init_loss is None:  # the init_loss instrument's step-0 row
        init_loss = next((_number(r[INIT_LOSS]) for r in rows if INIT_LOSS in r), None)
    return find_events(rows, warmup, init_loss, fp16, int(total) if total else None)


def events_from_summary(summary: dict[str, Any]) -> list[Event] | None:
    """The events summary.json records; None when it records none (an older run)."""
    recorded = summary.get("events")
    if not isinstance(recorded, list):
        return None
    return [
        Event(str(e["kind"]), int(e["step"]))
        for e in recorded
        if isinstance(e, dict) and "kind" in e and "step" in e
    ]


def events_text(events: Sequence[Event] | None) -> str:
    """'E2 divergence@412, E1 nonfinite@530'; 'none'; '-' when not measured."""
    if events is None:
        return "-"
    if not events:
        return "none"
    return ", ".join(f"{CODES.get(e.kind, '?')} {e.kind}@{e.step}" for e in events)
