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


@lru_cache(maxsize=1024)
def _subset_sums(values: tuple[int, ...], size: int) -> np.ndarray:
    """counts[k, s]: the number of k-subsets (k <= size) of `values` that sum to s."""
    total = sum(values)
    counts = np.zeros((size + 1, total + 1), dtype=np.float64)
    counts[0, 0] = 1.0
    for v in values:
        for k in range(size, 0, -1):  # descending: each value used once
            counts[k, v:] += counts[k - 1, : total + 1 - v]
    counts.flags.writeable = False  # cached: shared by every claim of the arm
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


# --- beyond statistics.EXACT_LIMIT: tails without the joint table, the interval from it -------
# With n = 100 seeds per arm the joint (k, sum) table of relabelling_counts is 101 convolutions of
# ~2000-long rows per claim; a tail needs only, for each k, the count of B-subset sums below one
# threshold, a dot product with the cumulative counts (exact, as above). The interval needs the
# joint table's breakpoints, computed by FFT (absolute error ~1e-16 of the largest count, far
# below the alpha / C(n_a + n_b, n_a) scale its edges are read at).


def _arms(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Subset-sum counts of A (k <= n_a), of B (k <= min(n_a, n_b)), and the k of a relabelling
    whose A arm keeps k original A seeds."""
    na, nb = a.size, b.size
    in_a = _subset_sums(tuple(sorted(int(x) for x in a)), na)
    in_b = _subset_sums(tuple(sorted(int(x) for x in b)), min(na, nb))
    return in_a, in_b, np.arange(max(0, na - nb), na + 1)


def cumulative_tails(a: np.ndarray, b: np.ndarray, margin: float, tol: float) -> np.ndarray:
    """(3,) the same tails as integer_tails (A lower, B lower, equivalent), each count a sum over
    k of A's k-subset counts times the cumulative count of B's (n_a - k)-subsets below the
    threshold that the observed statistic sets for an A-arm sum."""
    na, nb = a.size, b.size
    in_a, in_b, ks = _arms(a, b)
    cdf_b = np.cumsum(in_b, axis=1)
    last = cdf_b.shape[1] - 1
    total, observed = float(a.sum() + b.sum()), float(a.sum())
    scale = 1.0 / na + 1.0 / nb
    r = float(comb(na + nb, na))

    def below(k: int, j: int) -> float:
        """Relabellings keeping k A seeds whose arm sum s_a + s_b is <= j: sum over s_a of A's
        k-subset count times B's (n_a - k)-subset count with s_b <= j - s_a."""
        row, wa = cdf_b[na - k], in_a[k]
        if j < 0:
            return 0.0
        full = min(j - last, wa.size)  # s_a < j - last: every B sum fits
        got = row[last] * wa[: max(full, 0)].sum()
        lo, hi = max(full, 0), min(j, wa.size - 1)
        if hi >= lo:  # s_b index j - s_a runs down from j - lo to j - hi
            got += wa[lo : hi + 1] @ row[j - hi : j - lo + 1][::-1]
        return float(got)

    def tail(shift: float, lower: bool) -> float:
        # d(s) = (s - shift k) scale - (total - shift n_a) / n_b for an A-arm sum s, increasing
        rest = (total - shift * na) / nb
        obs = (observed - shift * na) * scale - rest
        slack = tol * max(1.0, abs(obs))
        bound = (obs + slack) if lower else (obs - slack)
        thr = (bound + rest) / scale + shift * ks  # arm-sum threshold per k
        if lower:  # arm sums <= floor(thr)
            return sum(below(int(k), int(np.floor(t))) for k, t in zip(ks, thr, strict=True)) / r
        # arm sums >= ceil(thr): all of the k's relabellings but those below it
        above = [
            cdf_b[na - k, last] * in_a[k].sum() - below(int(k), int(np.ceil(t)) - 1)
            for k, t in zip(ks, thr, strict=True)
        ]
        return sum(above) / r

    low_lower, high_upper = tail(-margin, True), tail(margin, False)
    return np.array([low_lower, high_upper, max(tail(-margin, False), tail(margin, True))])


def joint_counts(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k, arm sum, count) of every relabelling as relabelling_counts, the per-k convolutions by
    FFT (negligible rounding clipped at 0)."""
    na = a.size
    in_a, in_b, ks = _arms(a, b)
    width = in_a.shape[1] + in_b.shape[1] - 1
    size = 1 << (width - 1).bit_length()
    joint = np.fft.irfft(
        np.fft.rfft(in_a[ks], size, axis=1) * np.fft.rfft(in_b[na - ks], size, axis=1),
        size,
        axis=1,
    )[:, :width]
    keep = joint > 1e-12 * joint.max()
    k_of, s_of = np.nonzero(keep)
    return ks[k_of], s_of.astype(np.float64), joint[keep]


def integer_interval(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float]:
    """The (1 - 2 alpha) Fisher-Pitman interval of statistics.permutation_interval for integer
    seeds, read off the tails' breakpoints instead of bisected: a relabelling keeping k < n_a
    original A seeds with A-arm sum s counts in the upper tail from the shift (observed - s) /
    (n_a - k) on and in the lower tail up to it; the edges are where a tail's share passes alpha
    (the identity, k = n_a, counts in both at every shift)."""
    na = a.size
    ka, sums, count = joint_counts(a, b)
    r = count.sum()  # C(n_a + n_b, n_a) up to rounding
    moving = ka < na
    base = count[~moving].sum() / r
    delta = float(a.mean() - b.mean())
    span = float(np.ptp(np.concatenate([a, b]))) + 1.0
    if base > alpha:  # every shift in the bisection's range is inside
        return delta - span, delta + span
    t = (float(a.sum()) - sums[moving]) / (na - ka[moving])
    order = np.argsort(t, kind="stable")
    t, c = t[order], count[moving][order]
    up = base + np.cumsum(c) / r  # upper-tail share from shift t[j] on
    low = base + np.cumsum(c[::-1]) / r  # lower-tail share up to shift t[::-1][j]
    lo = t[int(np.argmax(up > alpha))] if up[-1] > alpha else delta + span
    hi = t[::-1][int(np.argmax(low > alpha))] if low[-1] > alpha else delta - span
    return float(max(lo, delta - span)), float(min(hi, delta + span))
