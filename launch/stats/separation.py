"""Two groups of seeds compared by a ratio: the rule the study's descriptive growth claims use,
and what "trained" means.

A group is the values of one recipe at one grid point, one per seed. A seed trained when its loss
is finite and below the data's unigram plateau by TRAINED_MARGIN (`trained`). Ratios (activation
growth) compare on log values; group A against group B comes out

- "higher": every seed of A >= every seed of B x ratio, or (with >= MIN_TEST_SEEDS seeds on each
  side) the one-sided exact Mann-Whitney U test of log A - log ratio against log B gives
  p <= ALPHA;
- "lower": the mirror image;
- "same": the geometric means lie within the ratio either way;
- "unclear": anything else (a value missing, or the seeds do not separate).

Gaps are compared with a tolerance of TOL, so a gap equal to the margin in decimal arithmetic
counts as meeting it. (The loss rule that once compared eval losses point by point here is
retired: loss claims are decided over seeds at each recipe's own best learning rate, SCIENCE.md
22, launch/verdicts.)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

# nats below the unigram plateau a seed must reach to count as trained: on the bundled corpus
# (plateau 6.258 at vocab 4096) stalled Post-LN runs ended at 6.16-6.24, trained ones near 5.1
TRAINED_MARGIN = 0.2
GROWTH_RATIO = 1.25  # activation-growth ratios within 1/1.25 .. 1.25 count as the same
ALPHA = 0.05  # the test's level (one-sided)
MIN_TEST_SEEDS = 3  # seeds per side before the test may replace full separation
TOL = 1e-9
EXACT_LIMIT = 50_000  # largest number of splits enumerated for the exact p-value

HIGHER, LOWER, SAME, UNCLEAR, UNTRAINED = "higher", "lower", "same", "unclear", "untrained"


def trained(loss: float, plateau: float, margin: float = TRAINED_MARGIN) -> bool:
    """A seed trained: its loss is finite and at least `margin` nats below the plateau."""
    return math.isfinite(loss) and loss <= plateau - margin + TOL


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test that A tends to exceed B.

    U counts pairs (a_i > b_j) plus half the ties; p is the share of the C(n+m, n) ways to split
    the pooled values into groups of A's and B's sizes whose U is at least the observed one
    (exact, ties included, for up to EXACT_LIMIT splits; else the normal approximation with the
    tie correction and a continuity correction). Infinite values rank above every finite one."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return math.nan

    def u_of(xs: list[float], ys: list[float]) -> float:
        return sum((x > y) + 0.5 * (x == y) for x in xs for y in ys)

    observed = u_of(a, b)
    pooled = [*a, *b]
    if math.comb(n + m, n) <= EXACT_LIMIT:
        count = total = 0
        for picked in itertools.combinations(range(n + m), n):
            chosen = set(picked)
            xs = [pooled[i] for i in picked]
            ys = [pooled[i] for i in range(n + m) if i not in chosen]
            count += u_of(xs, ys) >= observed - TOL
            total += 1
        return count / total
    ranks = _ranks(pooled)
    _, tie_counts = np.unique(ranks, return_counts=True)
    big = n + m
    var = n * m / 12 * ((big + 1) - float(np.sum(tie_counts**3 - tie_counts)) / (big * (big - 1)))
    z = (observed - n * m / 2 - 0.5) / math.sqrt(var) if var > 0 else 0.0
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: list[float]) -> np.ndarray:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = np.empty(len(values))
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@dataclass(frozen=True)
class Comparison:
    """One grid point: the outcome, the seeds' values and why."""

    outcome: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    why: str


def _above(a: list[float], b: list[float], gap: float, label: str) -> tuple[bool, str]:
    """A above B by `gap` (named `label`): every seed, or the test with enough seeds.

    Returns (holds, how it was shown)."""
    if min(a) - max(b) >= gap - TOL:
        return True, f"every seed apart by >= {label}"
    if min(len(a), len(b)) >= MIN_TEST_SEEDS:
        p = mann_whitney_p([x - gap for x in a], b)
        if p <= ALPHA + TOL:
            return True, f"Mann-Whitney p {p:.3g} <= {ALPHA:g}"
    return False, ""


def compare_ratio(a: list[float], b: list[float], ratio: float = GROWTH_RATIO) -> Comparison:
    """A's ratios (e.g. activation growth) against B's, on log values; both must be measured."""
    values = (tuple(a), tuple(b))
    if not a or not b or any(not (math.isfinite(v) and v > 0) for v in [*a, *b]):
        return Comparison(UNCLEAR, *values, "a value is missing or not positive")
    la, lb, gap = [math.log(v) for v in a], [math.log(v) for v in b], math.log(ratio)
    for outcome, (x, y) in ((HIGHER, (la, lb)), (LOWER, (lb, la))):
        up, how = _above(x, y, gap, f"x{ratio:g}")
        if up:
            return Comparison(outcome, *values, how)
    if abs(float(np.mean(la) - np.mean(lb))) < gap - TOL:
        return Comparison(SAME, *values, f"means within x{ratio:g}")
    return Comparison(UNCLEAR, *values, f"means apart by more than x{ratio:g} but seeds overlap")
