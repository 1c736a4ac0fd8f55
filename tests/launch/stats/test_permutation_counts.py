"""The counted permutation tails (launch.stats.permutation_counts) against enumeration: the same
floats wherever every relabelling is enumerated, and the full enumeration beyond the random
subset statistics.EXACT_LIMIT keeps (9 + 9 seeds: C(18, 9) = 48,620 relabellings)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from normlab.launch.stats import statistics as st
from normlab.launch.stats.permutation_counts import integer_tails
from normlab.launch.verdicts import family as vc


def enumerated(a: np.ndarray, b: np.ndarray, margin: float, monkeypatch) -> np.ndarray:
    monkeypatch.setattr(vc, "COUNT_FROM", 10**12)  # the enumeration path
    return vc.permutation_p3(a, b, margin)


@pytest.mark.parametrize(("na", "nb"), [(3, 4), (7, 7), (8, 8), (5, 9)])
def test_counted_tails_are_the_enumerated_floats(na: int, nb: int, monkeypatch) -> None:
    rng = np.random.default_rng(na * 10 + nb)
    a = rng.integers(0, 6, (40, na)).astype(float)
    b = rng.integers(0, 6, (40, nb)).astype(float)
    want = enumerated(a, b, vc.RANGE_MARGIN, monkeypatch)
    got = np.stack(
        [integer_tails(x, y, vc.RANGE_MARGIN, st.TOL) for x, y in zip(a, b, strict=True)]
    )
    assert np.array_equal(got, want)


def brute(a: np.ndarray, b: np.ndarray, margin: float) -> np.ndarray:
    """Every relabelling, one at a time: the definition of the three tails."""
    pooled, na, nb = np.concatenate([a, b]), a.size, b.size

    def d(idx: tuple[int, ...], shift: float) -> float:
        k = sum(i < na for i in idx)
        s, t = pooled[list(idx)].sum() - shift * k, pooled.sum() - shift * na
        return s / na - (t - s) / nb

    arms = list(combinations(range(na + nb), na))
    out = []
    for shift, lower in ((-margin, True), (margin, False), (-margin, False), (margin, True)):
        obs = d(tuple(range(na)), shift)
        slack = st.TOL * max(1.0, abs(obs))
        hits = [
            (d(i, shift) <= obs + slack) if lower else (d(i, shift) >= obs - slack) for i in arms
        ]
        out.append(sum(hits) / len(arms))
    return np.array([out[0], out[1], max(out[2], out[3])])


def test_beyond_the_enumeration_limit_every_relabelling_counts() -> None:
    rng = np.random.default_rng(5)
    for _ in range(2):
        a, b = rng.integers(0, 4, 9).astype(float), rng.integers(1, 5, 9).astype(float)
        got = vc.permutation_p3(a, b, vc.RANGE_MARGIN)
        assert got == pytest.approx(brute(a, b, vc.RANGE_MARGIN), abs=1e-12)
