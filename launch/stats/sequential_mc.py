"""Monte-Carlo permutation p-values with sequential stopping (Besag and Clifford 1991), for the
permutation tests whose exact count of relabellings is out of reach (C(n_a + n_b, n_a) beyond
statistics.EXACT_LIMIT).

Relabellings are drawn uniformly at random (seeded: the same table gives the same p) in batches;
each tail counts its exceedances g (relabellings at least as extreme as the observed statistic).
A tail stops at the draw L where g reaches H exceedances, with p = H / L; a tail that never
reaches H stops at N draws with p = (g + 1) / (N + 1) (the observed labelling counted once: a
valid p-value, never 0). Every tail of one test shares the draws; the test stops when each tail
has stopped. A large p thus costs about H / p draws, a small one N.

The Monte-Carlo standard error stated with each p: sqrt(p (1 - p) / (N + 1)) at N draws, and, for
a tail stopped at H exceedances, the delta-method SE of H / L under L's negative binomial law,
p sqrt((1 - p) / H).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EXCEEDANCES = 10  # H: a tail stops once this many relabellings reach its observed value
RESAMPLES = 199  # N: the most relabellings drawn for one test (p >= 1 / 200)
BATCH = 100  # relabellings drawn and evaluated at once (a large p stops after one)
SEED = 0


@dataclass(frozen=True)
class McP:
    """A sequential Monte-Carlo p-value: p, its Monte-Carlo standard error, the relabellings
    drawn for it and whether it stopped at H exceedances (else at N draws)."""

    p: float
    se: float
    draws: int
    stopped_early: bool

    def text(self) -> str:
        how = (
            f"stopped at {EXCEEDANCES} exceedances"
            if self.stopped_early
            else f"{self.draws} resamples"
        )
        return f"Monte-Carlo, {how}, MC SE {self.se:.2g}"


def mc_se(p: float, draws: int, stopped_early: bool) -> float:
    """The Monte-Carlo standard error of a sequential p (module docstring)."""
    if stopped_early:
        return p * math.sqrt(max(0.0, 1.0 - p) / EXCEEDANCES)
    return math.sqrt(p * (1.0 - p) / (draws + 1))


def random_relabellings(rng: np.random.Generator, count: int, n: int, n_a: int) -> np.ndarray:
    """(count, n) boolean masks: True for the units a uniform random relabelling puts in A."""
    order = np.argsort(rng.random((count, n)), axis=1)
    mask = np.zeros((count, n), dtype=bool)
    np.put_along_axis(mask, order[:, :n_a], True, axis=1)
    return mask


def sequential_p(
    hits: Callable[[np.ndarray], np.ndarray],
    n: int,
    n_a: int,
    exceedances: int = EXCEEDANCES,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> list[McP]:
    """One McP per tail. `hits(mask)` takes (B, n) relabelling masks (True: in A) and returns
    (B, T) booleans: whether each relabelling is at least as extreme as the observed one in
    each of the T tails."""
    rng = np.random.default_rng(seed)
    counts: np.ndarray | None = None
    stop_at: np.ndarray | None = None  # the draw at which each tail reached `exceedances`
    drawn = 0
    while drawn < resamples:
        batch = min(BATCH, resamples - drawn)
        h = np.asarray(hits(random_relabellings(rng, batch, n, n_a)), dtype=bool)
        if counts is None:
            counts = np.zeros(h.shape[1], dtype=np.int64)
            stop_at = np.zeros(h.shape[1], dtype=np.int64)
        assert stop_at is not None
        running = counts[None, :] + np.cumsum(h, axis=0)  # exceedances after each draw
        for t in np.flatnonzero(stop_at == 0):
            reached = np.flatnonzero(running[:, t] >= exceedances)
            if reached.size:
                stop_at[t] = drawn + int(reached[0]) + 1
        counts = running[-1]
        drawn += batch
        if np.all(stop_at > 0):
            break
    assert counts is not None and stop_at is not None
    out = []
    for g, at in zip(counts, stop_at, strict=True):
        if at > 0:
            p = exceedances / float(at)
            out.append(McP(p, mc_se(p, int(at), True), int(at), True))
        else:
            p = (int(g) + 1) / (drawn + 1)
            out.append(McP(p, mc_se(p, drawn, False), drawn, False))
    return out
