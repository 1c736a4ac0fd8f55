"""`normlab warnings`: every logged precursor signal scored against the runs' events (23.3).

Thresholds (k, and the level alarm: off or a level) are tuned on the runs of seeds {0, 1}: the
largest recall@10 with at most 1 false alarm per 1,000 healthy steps (ties: fewer false alarms,
then no level, then the more cautious level, then the larger k); every reported number comes from
the other seeds. The candidate levels are SCIENCE.md 23.2's for the signals it gives one (the
ratio levels only that one) and, for every signal on its raw scale, the quantiles LEVEL_Q of the
tuning runs' values (the low ones for a falling signal): a level for a signal that drifts rather
than jumps ([choice], issue 32: the fp16 overflows of docs/early_warning.md are announced by the
residual stream's level, not by a jump). Each signal is set against
the loss baseline on the same held-out events: McNemar's exact test on detected-or-not at 10
steps, Wilcoxon's signed-rank test on lead times (a missed event leads by 0). A signal "warns
earlier than the loss" only when its recall@10 is higher, McNemar's p < 0.05 and its false-alarm
rate is no higher than max(the loss's, the budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from normlab.launch.metric_keys import block_keys
from normlab.launch.rundir.runs import Run, load_run
from normlab.launch.warning.detector import alarms, zscores
from normlab.launch.warning.events import events_from_summary, run_events
from normlab.launch.warning.scoring import RECALL_AT, RunAlarms, Score, score, wilson
from normlab.launch.warning.signals import BASELINE, SIGNALS, Signal, level_rule

TUNE_SEEDS = (0, 1)
K_GRID = (3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0, 30.0, 50.0)
LEVEL_Q = (0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)  # level candidates [choice]
FA_BUDGET = 1.0  # false alarms per 1,000 healthy steps
ALPHA = 0.05


@dataclass
class RunData:
    """One run as the evaluation sees it: its seed, length, first event, and per signal the
    (steps, values) series of each of its keys."""

    name: str
    seed: int | None
    steps: int
    warmup: int
    event: int | None
    event_kind: str | None
    series: dict[str, list[tuple[list[int], list[float]]]] = field(default_factory=dict)
    _z: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, repr=False)

    def alarms(self, signal: Signal, k: float, level: float | None) -> tuple[int, ...]:
        """The union over the signal's keys (blocks) of the detector's alarm steps, with the
        level alarm at `level` (None: off)."""
        rule = level_rule(signal, level)
        found: set[int] = set()
        for i, (steps, values) in enumerate(self.series.get(signal.name, [])):
            z = self._z.get((signal.name, i))
            if z is None:
                z = self._z[(signal.name, i)] = zscores(values, transform=signal.rule.transform)
            found.update(alarms(steps, values, rule, k, self.warmup, level is not None, z=z))
        return tuple(sorted(found))


def run_data(run: Run) -> RunData:
    cfg = run.config
    training = cfg.get("training") or {}
    events = events_from_summary(run.summary)
    if events is None or run.summary.get("status") == "running":
        events = run_events(run.train, cfg)
    first = events[0] if events else None
    data = RunData(
        name=str(run.path),
        seed=training.get("seed"),
        steps=int(training.get("steps") or 0),
        warmup=int((cfg.get("schedule") or {}).get("warmup_steps") or 0),
        event=first.step if first else None,
        event_kind=first.kind if first else None,
    )
    for signal in SIGNALS.values():
        keys = _keys(run, signal)
        if keys:
            data.series[signal.name] = [run.series(k) for k in keys]
    return data


def _keys(run: Run, signal: Signal) -> list[str]:
    present = {k for row in run.train for k in row}
    if not signal.per_block:
        return [signal.key] if signal.key in present else []
    return block_keys(signal.key, present)  # whole-block keys, not the per-sub-layer ones


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Each path that is a run (config.yaml), else every run below it (a study directory)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "config.yaml").is_file():
            out.append(p)
        else:
            out += sorted(c.parent for c in p.rglob("config.yaml") if "checkpoints" not in c.parts)
    return out


@dataclass
class Tuned:
    k: float
    level: float | None  # the level alarm's threshold, None: off
    met_budget: bool  # some threshold kept the tuning seeds within the false-alarm budget
    tune: Score


def level_candidates(signal: Signal, runs: Sequence[RunData]) -> list[float | None]:
    """Off, SCIENCE.md 23.2's level, and (raw-scale signals) quantiles of the tuning values."""
    out: list[float | None] = [None]
    if signal.rule.level is not None:
        out.append(signal.rule.level)
    if signal.rule.level_is_ratio:
        return out
    pooled = [
        v for r in runs for _, values in r.series.get(signal.name, []) for v in values
        if math.isfinite(v)
    ]  # fmt: skip
    if pooled:
        qs = LEVEL_Q if signal.rule.rising else tuple(1 - q for q in LEVEL_Q)
        for q in np.quantile(np.asarray(pooled, dtype=np.float64), qs):
            if float(q) not in out:
                out.append(float(q))
    return out


def tune(signal: Signal, runs: Sequence[RunData]) -> Tuned:
    best: tuple | None = None
    sign = 1.0 if signal.rule.rising else -1.0
    for level in level_candidates(signal, runs):
        for k in K_GRID:
            s = _score(signal, runs, k, level)
            ok = s.false_per_1000 <= FA_BUDGET if s.healthy_steps else True
            recall = s.recall(10) if s.events else 0.0
            fa = s.false_per_1000 if s.healthy_steps else 0.0
            cautious = math.inf if level is None else sign * level
            key = (ok, recall if ok else -fa, -fa, level is None, cautious, k)
            if best is None or key > best[0]:
                best = (key, Tuned(k, level, ok, s))
    assert best is not None
    return best[1]


def _score(signal: Signal, runs: Sequence[RunData], k: float, level: float | None) -> Score:
    return score([RunAlarms(r.name, r.steps, r.event, r.alarms(signal, k, level)) for r in runs])


@dataclass
class Result:
    signal: Signal
    tuned: Tuned
    held: Score
    curve: list[tuple[float, float, float]]  # (k, false alarms / 1000, recall@10) held out
    mcnemar_p: float = math.nan
    wilcoxon_p: float = math.nan
    holm_p: float = math.nan  # McNemar p, Holm-adjusted over every signal compared with the loss
    beats_loss: bool = False

    def row(self) -> dict[str, Any]:
        s, leads = self.held, [x for x in self.held.leads if x is not None]
        out: dict[str, Any] = {
            "signal": self.signal.name,
            "k": self.tuned.k,
            "level": self.tuned.level,
            "budget_met_on_tuning": self.tuned.met_budget,
            "events": s.events,
            "lead_median": float(np.median(leads)) if leads else None,
            "lead_q25": float(np.percentile(leads, 25)) if leads else None,
            "lead_q75": float(np.percentile(leads, 75)) if leads else None,
            "false_per_1000": s.false_per_1000,
            "healthy_steps": s.healthy_steps,
            "precision": s.precision,
            "episodes": s.true_episodes + s.false_episodes,
            "mcnemar_p": self.mcnemar_p,
            "wilcoxon_p": self.wilcoxon_p,
            "holm_p": self.holm_p,
            "beats_loss": self.beats_loss,
        }
        for k in RECALL_AT:
            lo, hi = wilson(s.detected(k), s.events)
            out[f"recall@{k}"] = s.recall(k)
            out[f"recall@{k}_ci"] = [lo, hi]
        return out


def evaluate(runs: Sequence[RunData]) -> tuple[list[Result], list[RunData], list[RunData]]:
    """(a result per signal logged by every run, tuning runs, held-out runs)."""
    tuning = [r for r in runs if r.seed in TUNE_SEEDS]
    held = [r for r in runs if r.seed not in TUNE_SEEDS]
    names = [n for n in SIGNALS if runs and all(n in r.series for r in runs)]
    results = []
    for name in names:
        signal = SIGNALS[name]
        tuned = tune(signal, tuning)
        curve = []
        for k in K_GRID:
            s = _score(signal, held, k, tuned.level)
            curve.append((k, s.false_per_1000, s.recall(10)))
        results.append(Result(signal, tuned, _score(signal, held, tuned.k, tuned.level), curve))
    base = next((r for r in results if r.signal.name == BASELINE), None)
    if base is not None:
        compared = [r for r in results if r is not base]
        for r in compared:
            _paired(r, base)
        _holm(compared)
    return results, tuning, held


def _holm(compared: Sequence[Result]) -> None:
    """Holm over every signal compared with the loss (SCIENCE.md 23.3, multiplicity): only a
    signal whose adjusted McNemar p stays under ALPHA keeps `beats_loss`."""
    from normlab.launch.stats.statistics import holm_adjusted

    for r, adj in zip(compared, holm_adjusted([r.mcnemar_p for r in compared]), strict=True):
        r.holm_p = adj
        r.beats_loss = bool(r.beats_loss and adj < ALPHA)


def _paired(r: Result, base: Result) -> None:
    """McNemar (exact) on detected@10 and Wilcoxon on leads over the same held-out events."""
    from scipy.stats import binomtest, wilcoxon

    if not r.held.leads:
        return  # no held-out event: nothing to pair
    a = [x is not None and x >= 10 for x in r.held.leads]
    b = [x is not None and x >= 10 for x in base.held.leads]
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    r.mcnemar_p = binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
    la = np.array([x or 0.0 for x in r.held.leads])
    lb = np.array([x or 0.0 for x in base.held.leads])
    r.wilcoxon_p = float(wilcoxon(la, lb).pvalue) if np.any(la != lb) else 1.0
    budget = max(base.held.false_per_1000, FA_BUDGET)
    fa = r.held.false_per_1000
    r.beats_loss = bool(
        r.held.recall(10) > base.held.recall(10)
        and r.mcnemar_p < ALPHA
        and (math.isnan(fa) or fa <= budget)
    )


def load(paths: Sequence[str | Path | Run]) -> list[RunData]:
    """The runs below `paths`; a Run given in place of a path (a history from another trainer,
    launch/histories) is used as it is."""
    out: list[RunData] = []
    for p in paths:
        if isinstance(p, Run):
            out.append(run_data(p))
        else:
            out += [run_data(load_run(d)) for d in find_run_dirs([p])]
    return out
