"""Verdicts under a plan of looks (docs/SCIENCE.md 22.8; launch.verdicts.family.decide_family and
decide): each claim's level is its look's nominal level, Holm across looks is the closed test of
sequential Bonferroni tests (checked by enumerating every intersection), and a look outside the
plan is said so."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from normlab.launch.stats import group_sequential as gs
from normlab.launch.stats import statistics as st
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.decide import Claim, decide
from normlab.launch.verdicts.results_table import Run, build_cells

PLAN = gs.Plan(gs.POCOCK, (3, 8))


def closed_test(p: np.ndarray, looks: list[gs.Look], alpha: float) -> np.ndarray:
    """Claim j is rejected when every intersection I containing it is, H_I by the sequential
    Bonferroni test: some i in I with p_i <= nominal_i(alpha / |I|)."""
    m = len(p)
    out = np.zeros(m, dtype=bool)
    for j in range(m):
        out[j] = all(
            any(p[i] <= gs.nominal_level(alpha / len(sub), looks[i]) for i in sub)
            for r in range(1, m + 1)
            for sub in combinations(range(m), r)
            if j in sub
        )
    return out


def test_holm_across_looks_is_the_closed_test() -> None:
    rng = np.random.default_rng(3)
    looks = [gs.look_at(PLAN, n) for n in (3, 8, 8, 3)]
    for _ in range(25):
        p = 10 ** rng.uniform(-4.5, -1.0, size=4)
        p3 = np.stack([p, np.ones(4), np.ones(4)], axis=-1)  # the "A lower" row decides
        codes, level = vc.decide_family(p3, 0.05, looks)
        np.testing.assert_array_equal(codes == 0, closed_test(p, looks, 0.05))
        np.testing.assert_array_equal(codes == 0, p <= level)


def test_no_plan_is_plain_holm() -> None:
    p3 = np.array([[0.001, 0.9, 0.9], [0.02, 0.9, 0.9], [0.2, 0.9, 0.9]])
    codes, level = vc.decide_family(p3, 0.05, None)
    np.testing.assert_allclose(level, st.holm(p3.min(axis=-1), 0.05)[1])
    codes_seq, level_seq = vc.decide_family(p3, 0.05, [gs.look_at(PLAN, 8)] * 3)
    assert (level_seq < level).all()  # the last look of a two-look plan spends less than alpha


def _runs(recipe: str, offsets: np.ndarray) -> list[Run]:
    lrs = (1e-3, 3e-3, 1e-2)
    base = np.array([5.2, 5.0, 5.3])
    return [
        Run(recipe, "-", lr, s, float(base[i] + off), "completed", 10.0)
        for s, off in enumerate(offsets)
        for i, lr in enumerate(lrs)
    ]


def test_decide_uses_each_claims_look() -> None:
    rng = np.random.default_rng(0)
    runs = _runs("a", 0.02 * rng.standard_normal(8)) + _runs("b", 0.02 * rng.standard_normal(8))
    runs += _runs("c", 0.02 * rng.standard_normal(3)) + _runs("d", 0.02 * rng.standard_normal(3))
    runs += _runs("e", 0.02 * rng.standard_normal(9)) + _runs("f", 0.02 * rng.standard_normal(9))
    cells = build_cells(runs)
    claims = [Claim(a, b, vc.LOSS, st.EQUIVALENT) for a, b in (("a", "b"), ("c", "d"), ("e", "f"))]
    plain = decide(cells, claims)
    seq = decide(cells, claims, plan=PLAN)
    ab, cd, ef = seq
    for v, n in ((ab, 8), (cd, 3)):
        look = gs.look_at(PLAN, n)
        holm = [x.level for x in plain if x.a == v.a][0]
        # the same claims, so the same Holm order here: its level through the look's boundary
        assert v.level <= gs.nominal_level(0.05, look)
        assert f"look {look.index} of 2 at n {n}" in v.rule and "Pocock-type" in v.rule
        assert holm >= v.level
    assert ab.verdict == st.EQUIVALENT and not ab.note
    # nine seeds per arm: past the plan's last look, no alpha, no verdict, and it says so
    assert ef.level == 0.0 and ef.verdict == st.INCONCLUSIVE
    assert "past the plan's last look (n 8)" in ef.note and ef.seeds_needed is None
    assert "seeds per arm" not in ef.note
    assert [x.verdict for x in plain if x.a == "e"] == [st.EQUIVALENT]


def test_inconclusive_at_the_last_look_says_more_seeds_need_a_new_plan() -> None:
    rng = np.random.default_rng(1)
    runs = _runs("a", 0.3 * rng.standard_normal(8)) + _runs("b", 0.3 * rng.standard_normal(8))
    late = gs.Plan(gs.POCOCK, (3, 8), registered=False)
    (v,) = decide(build_cells(runs), [Claim("a", "b", vc.LOSS, st.EQUIVALENT)], plan=late)
    assert v.verdict == st.INCONCLUSIVE
    assert "without a pre-registered plan" in v.note and "a new study with its own plan" in v.note
    assert "recorded after the looks" in v.rule
    assert v.level == pytest.approx(gs.nominal_level(0.05, gs.look_at(late, 8)))
