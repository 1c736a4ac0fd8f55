"""The predictions of `normlab theory` decided over seeds (SCIENCE.md section 3).

Every check is a statistic of the mean over seeds (a ratio, a slope, a worst deviation) against a
boundary. A single mean would call 1.21 against a 1.2 threshold a pass although the seeds spread
the per-layer values by +-15 %; so each check resamples the seeds (bootstrap, BOOT_REPS draws with
replacement, a fixed generator), and the rule holds only when the 95 % interval of its signed
margin clears the boundary: 'held' above it, 'failed' below it, 'undecided' across it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from normlab.launch.theory.measure import (
    TheoryResult,
    ffn_gain,
    lemma2_prediction,
    loglog_slope,
)

BOOT_REPS = 2000  # bootstrap resamples of the seeds
BOOT_LEVEL = 0.95  # two-sided interval
MIN_SEEDS = 3  # fewer seeds carry no usable spread: every verdict is undecided
HELD, FAILED, UNDECIDED = "held", "failed", "undecided"


def bootstrap(
    values: np.ndarray,
    stat: Callable[[np.ndarray], float],
    margin: Callable[[float], float],
    reps: int = BOOT_REPS,
    seed: int = 0,
) -> tuple[float, float, float, str]:
    """(estimate, low, high, verdict) of `stat` over the seeds in `values` (seeds, ...).

    The estimate is `stat` of the mean over seeds; each resample draws as many seeds with
    replacement and takes `stat` of their mean. `margin` maps a statistic to a signed distance
    from the rule's boundary (> 0: the rule holds). The verdict is 'held' when the lower
    (1 - BOOT_LEVEL) / 2 quantile of the resampled margins is above 0, 'failed' when the upper
    one is below 0, and 'undecided' when the interval straddles the boundary (more seeds decide
    it); always 'undecided' with fewer than MIN_SEEDS seeds. (low, high) is the same percentile
    interval of the statistic itself."""
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, size=(reps, n))
    stats = np.array([stat(values[idx].mean(0)) for idx in picks])
    margins = np.array([margin(float(v)) for v in stats])
    q = (1 - BOOT_LEVEL) / 2
    lo, hi = np.quantile(stats, [q, 1 - q])
    m_lo, m_hi = np.quantile(margins, [q, 1 - q])
    verdict = HELD if m_lo > 0 else FAILED if m_hi < 0 else UNDECIDED
    if n < MIN_SEEDS:
        verdict = UNDECIDED
    return stat(values.mean(0)), float(lo), float(hi), verdict


@dataclass
class Check:
    claim: str
    rule: str
    measured: str  # the estimate and its bootstrap interval over seeds
    verdict: str  # held | failed | undecided

    @property
    def held(self) -> bool:
        return self.verdict == HELD


def _within(x: float, lo: float, hi: float) -> float:
    """Signed distance of x inside [lo, hi] (> 0 inside)."""
    return min(x - lo, hi - x)


def _check(
    claim: str,
    rule: str,
    values: np.ndarray,
    stat: Callable[[np.ndarray], float],
    margin: Callable[[float], float],
    show: str,
    extra: str = "",
) -> Check:
    """`show`: 'name {format spec}', e.g. 'slope {:+.3f}', for the estimate and its interval."""
    est, lo, hi, verdict = bootstrap(values, stat, margin)
    name, spec = show.split(" ", 1)
    fmt = spec.format
    text = f"{name} {fmt(est)} ({BOOT_LEVEL:.0%} CI {fmt(lo)} .. {fmt(hi)}){extra}"
    return Check(claim, rule, text, verdict)


def checks(res: TheoryResult) -> list[Check]:
    """Each prediction against its stated rule, decided over seeds: the statistic of the mean
    over seeds, its bootstrap interval, and whether that interval clears the rule's boundary."""
    s, c = res.setup, ffn_gain(res.setup.d_ff_mult)
    pred = lemma2_prediction("post", 1, s.d_ff_mult)[0]
    layers = np.arange(1, res.lemma2["pre"].shape[1] + 1)
    bounds = np.array([lemma2_prediction("pre", int(layer), s.d_ff_mult) for layer in layers])

    def pre_margin(energy: np.ndarray) -> float:
        """Inside every layer's bounds (relative to the upper bound) and a slope per layer in
        [c, 1 + c]: > 0 when both hold."""
        inside = np.minimum(energy - bounds[:, 0], bounds[:, 1] - energy) / bounds[:, 1]
        return min(float(inside.min()), _within(float(np.polyfit(layers, energy, 1)[0]), c, 1 + c))

    pre = res.lemma2["pre"].mean(0)
    outside = [
        int(k) for k, v, (lo, hi) in zip(layers, pre, bounds, strict=True) if not lo <= v <= hi
    ]
    slope = float(np.polyfit(layers, pre, 1)[0])

    def worst_off(energy: np.ndarray) -> float:
        return float(np.max(np.abs(energy / pred - 1)))

    def slope_of(ys: np.ndarray) -> float:
        return loglog_slope(s.depths, ys)

    def last_first(g: np.ndarray) -> float:
        return float(g[-1] / g[0])

    def max_min(g: np.ndarray) -> float:
        return float(g.max() / g.min())

    return [
        _check(
            "Lemma 2, Post-LN: E||x_l||^2/d the same at every layer",
            f"every layer within 10% of {pred:.3g}",
            res.lemma2["post"], worst_off, lambda v: 0.10 - v, "worst-off {:.1%}",
        ),
        _check(
            "Lemma 2, Pre-LN: E||x_l||^2/d grows linearly with l",
            f"every layer in [1 + {c:.3g} l, 1 + {1 + c:.3g} l] and fitted slope per layer in "
            f"[{c:.3g}, {1 + c:.3g}]",
            res.lemma2["pre"], pre_margin, lambda v: v, "margin {:+.3g}",
            f"; {pre[0]:.3g} (l=1) .. {pre[-1]:.3g} (l={len(pre)}), slope {slope:.3g}"
            + (f", outside at l={outside}" if outside else ""),
        ),
        _check(
            "Theorem 1, Post-LN: last-MLP gradient independent of L",
            "log-log slope against L within 0 +- 0.15",
            res.theorem1["post"], slope_of, lambda v: 0.15 - abs(v), "slope {:+.3f}",
        ),
        _check(
            "Theorem 1, Pre-LN: last-MLP gradient falls as 1/sqrt(L)",
            "log-log slope against L within -0.5 +- 0.15",
            res.theorem1["pre"], slope_of, lambda v: 0.15 - abs(v + 0.5), "slope {:+.3f}",
        ),
        _check(
            "Figure 3, Post-LN: per-layer gradient grows toward the output",
            "last layer / first layer >= 1.2",
            res.profile["post"], last_first, lambda v: v - 1.2, "last/first {:.2f}",
        ),
        _check(
            "Figure 3, Pre-LN: per-layer gradient flat in depth",
            "max / min over layers <= 1.25",
            res.profile["pre"], max_min, lambda v: 1.25 - v, "max/min {:.2f}",
            f"; last/first {last_first(res.profile['pre'].mean(0)):.2f}",
        ),
    ]  # fmt: skip


SHOWN = {HELD: "yes", FAILED: "NO", UNDECIDED: "undecided"}


def check_table(found: list[Check]) -> list[str]:
    """The Markdown table of the checks: what `normlab theory` prints, as docs/theory holds it."""
    return [
        "| prediction | rule | measured | held |",
        "|---|---|---|---|",
        *(f"| {c.claim} | {c.rule} | {c.measured} | {SHOWN[c.verdict]} |" for c in found),
    ]
