"""Scoring alarms against events (SCIENCE.md 23.3): lead time, recall@k, false alarms per 1,000
healthy steps, precision, Wilson intervals; no torch, no scipy (the tests check the numbers).

A run's event time t_E is its first event of 23.1 (after it the run has failed: later alarms are
not scored). Horizon H = 20 % of the run's steps, at most 2,000. An alarm in [t_E - H, t_E) is
true; one before t_E - H (or in a run without an event) is false. Alarms closer than R = 50
steps merge into one episode, which counts at its first alarm. Healthy steps: every step of a run
without an event, and the t_E - H steps before the horizon of a run with one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HORIZON_SHARE, HORIZON_CAP, MERGE = 0.2, 2000, 50
RECALL_AT = (1, 10, 50)


@dataclass(frozen=True)
class RunAlarms:
    """One run's alarms of one signal, with what scoring them needs."""

    run: str
    steps: int  # the run's length (its configured steps, or where it stopped)
    event: int | None  # t_E: the step of its first event
    alarms: tuple[int, ...]


@dataclass(frozen=True)
class Score:
    events: int
    leads: tuple[float | None, ...]  # per event: t_E - first alarm in the horizon (None: missed)
    true_episodes: int
    false_episodes: int
    healthy_steps: int

    def recall(self, k: int) -> float:
        return self.detected(k) / self.events if self.events else math.nan

    def detected(self, k: int) -> int:
        return sum(lead is not None and lead >= k for lead in self.leads)

    @property
    def false_per_1000(self) -> float:
        return 1000 * self.false_episodes / self.healthy_steps if self.healthy_steps else math.nan

    @property
    def precision(self) -> float:
        total = self.true_episodes + self.false_episodes
        return self.true_episodes / total if total else math.nan


def horizon(steps: int) -> int:
    return min(HORIZON_CAP, int(HORIZON_SHARE * steps))


def episodes(alarms: Sequence[int], merge: int = MERGE) -> list[int]:
    """The first alarm of each episode: an alarm within `merge` steps of the previous one
    continues its episode."""
    starts: list[int] = []
    last = None
    for step in sorted(alarms):
        if last is None or step - last >= merge:
            starts.append(step)
        last = step
    return starts


def score_run(run: RunAlarms) -> tuple[float | None, int, int, int]:
    """(lead or None, true episodes, false episodes, healthy steps) of one run; lead is None
    for a run without an event too."""
    if run.event is None:
        return None, 0, len(episodes(run.alarms)), run.steps
    start = run.event - horizon(run.steps)
    before = [a for a in run.alarms if a < run.event]
    inside = [a for a in before if a >= start]
    lead = float(run.event - min(inside)) if inside else None
    eps = episodes(before)
    true = sum(e >= start for e in eps)
    # an episode that began before the horizon and runs into it warns too: its alarms inside
    # count for the lead, the episode itself stays a false one (it began when all was well)
    return lead, true, len(eps) - true, max(0, start)


def score(runs: Sequence[RunAlarms]) -> Score:
    leads, true, false, healthy = [], 0, 0, 0
    for run in runs:
        lead, t, f, h = score_run(run)
        if run.event is not None:
            leads.append(lead)
        true, false, healthy = true + t, false + f, healthy + h
    return Score(len(leads), tuple(leads), true, false, healthy)


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) for a proportion; (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
