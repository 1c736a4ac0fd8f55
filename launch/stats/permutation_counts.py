"""The exact Fisher-Pitman tails of `verdicts.family.permutation_p3` for integer-valued seeds (the
trained range's grid-point widths), counted instead of enumerated.

A relabelling puts `k` of the original A seeds and `n_a - k` of the B seeds into the A arm; its
statistic depends only on `k` and the arm's sum, so the number of relabellings with each (k, sum)
is all a tail needs: the k-subset sums of A and the (n_a - k)-subset sums of B are counted by the
subset-sum recursion and convolved. Every relabelling is counted (no random subset beyond
statistics.EXACT_LIMIT), and where enumeration is exact the tails are the same floats: the
statistic is computed by the same operations on the same integer-valued sums, and a share is
count / C(n_a + n_b, n_a) either way. Rows with the same multisets share one count (the A/A
simulation repeats them).
"""

from __future__ import annotations

from functools import lru_cache
from math import comb

import numpy as np

MAX_SUM = 4096  # integer sums beyond this go through enumeration instead


def integer_valued(pooled: np.ndarray) -> bool:
    """Every value a small non-negative integer (what the counting handles)."""
    return bool(
        pooled.size
        and np.all(np.isfinite(pooled))
        and np.all(pooled >= 0)
        and np.all(pooled == np.round(pooled))
        and pooled.sum(axis=-1).max() <= MAX_SUM
    )


def _subset_sums(values: tuple[int, ...], size: int) -> np.ndarray:
    """counts[k, s]: the number of k-subsets (k <= size) of `values` that sum to s."""
    total = sum(values)
    counts = np.zeros((size + 1, total + 1), dtype=np.float64)
    counts[0, 0] = 1.0
    for v in values:
        for k in range(size, 0, -1):  # descending: each value used once
            counts[k, v:] += counts[k - 1, : total + 1 - v]
    return counts


@lru_cache(maxsize=65536)
def relabelling_counts(
    a: tuple[int, ...], b: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k, arm sum, count) of every A-arm composition over all C(n_a + n_b, n_a) relabellings,
    for sorted integer seeds a and b."""
    na, nb = len(a), len(b)
    in_a, in_b = _subset_sums(a, na), _subset_sums(b, min(na, nb))
    ks, sums, counts = [], [], []
    for k in range(max(0, na - nb), na + 1):
        joint = np.convolve(in_a[k], in_b[na - k])
        nonzero = np.flatnonzero(joint)
        ks.append(np.full(nonzero.size, k))
        sums.append(nonzero.astype(np.float64))
        counts.append(joint[nonzero])
    return np.concatenate(ks), np.concatenate(sums), np.concatenate(counts)


def integer_tails(a: np.ndarray, b: np.ndarray, margin: float, tol: float) -> np.ndarray:
    """(3,) the tails of permutation_p3 for one row: A lower, B lower, equivalent."""
    na, nb = a.size, b.size
    ka, sel, count = relabelling_counts(
        tuple(sorted(int(x) for x in a)), tuple(sorted(int(x) for x in b))
    )
    total = np.concatenate([a, b]).sum()
    observed = a.sum()
    r = float(comb(na + nb, na))

    def shifted(sums: np.ndarray | float, k: np.ndarray | int, shift: float) -> np.ndarray:
        s, t = sums - shift * k, total - shift * na
        return s / na - (t - s) / nb

    def tail(shift: float, lower: bool) -> float:
        d, obs = shifted(sel, ka, shift), shifted(observed, na, shift)
        slack = tol * max(1.0, abs(float(obs)))
        hit = (d <= obs + slack) if lower else (d >= obs - slack)
        return float(count[hit].sum()) / r

    low_lower, high_upper = tail(-margin, True), tail(margin, False)
    return np.array([low_lower, high_upper, max(tail(-margin, False), tail(margin, True))])
