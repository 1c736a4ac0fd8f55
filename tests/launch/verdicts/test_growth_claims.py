"""The study's verdict rules on hand-made seed values whose outcome is decided by hand, with the
degenerate cases: every run diverged, every run on the plateau, one seed failing, the margin
exactly met, recipes not run; the Mann-Whitney p-value against an independent count."""

from __future__ import annotations

import math
from functools import cache

import pytest
from normlab.launch.stats.separation import (
    HIGHER,
    LOWER,
    SAME,
    UNCLEAR,
    UNTRAINED,
    compare_ratio,
    mann_whitney_p,
)
from normlab.launch.verdicts.growth_claims import (
    CLAIMS,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TESTED,
    REPRODUCED,
    Claim,
    decide,
    decide_all,
    group_rows,
    loss_of,
)

PLATEAU = 6.25  # trained: <= 6.05
INF = math.inf


@cache
def _count(n: int, m: int, u: int) -> int:
    """Arrangements of n A's and m B's (no ties) with Mann-Whitney U = u (A above B)."""
    if u < 0:
        return 0
    if n == 0 or m == 0:
        return int(u == 0)
    return _count(n - 1, m, u - m) + _count(n, m - 1, u)


@pytest.mark.parametrize("n, m", [(3, 3), (4, 4), (3, 5), (12, 14)])
def test_mann_whitney_p_against_the_counting_recurrence(n: int, m: int) -> None:
    total = math.comb(n + m, n)
    b = [float(v) for v in range(m)]
    for u in range(0, n * m + 1, max(1, n * m // 7)):
        ks, left = [], u  # A's seed i lies above ks[i] of B's values: U = sum(ks) = u
        for _ in range(n):
            ks.append(min(m, left))
            left -= ks[-1]
        a = [k - 0.5 + 1e-3 * i for i, k in enumerate(ks)]  # distinct, no ties with B
        expected = sum(_count(n, m, v) for v in range(u, n * m + 1)) / total
        got = mann_whitney_p(a, b)
        tol = 1e-12 if total <= 50_000 else 0.02  # beyond that: the normal approximation
        assert got == pytest.approx(expected, abs=tol), (u, got, expected)
    assert mann_whitney_p([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / 20)
    assert mann_whitney_p([4.0, 5, 6, 7], [0.0, 1, 2, 3]) == pytest.approx(1 / 70)


def test_mann_whitney_ties_and_infinities() -> None:
    assert mann_whitney_p([INF, INF, INF], [1.0, 2.0, 3.0]) == pytest.approx(1 / 20)
    assert mann_whitney_p([1.0, 1.0], [1.0, 1.0]) == 1.0  # every split ties: U = 2 always


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([1.00, 1.05], [1.50, 1.60], LOWER),  # ratio 1.43+ >= 1.25 seed by seed
        ([2.70, 2.80], [1.30, 1.40], HIGHER),
        ([1.30, 1.40], [1.35, 1.45], SAME),
        ([0.8, 1.6], [1.5, 1.6], UNCLEAR),  # geometric means x1.38 apart but the seeds overlap
        ([math.nan, 1.0], [1.5, 1.6], UNCLEAR),
        ([1.0, 1.0], [1.25, 1.25], LOWER),  # the ratio exactly met
    ],
)
def test_compare_ratio(a: list[float], b: list[float], expected: str) -> None:
    assert compare_ratio(a, b).outcome == expected


def test_diverged_or_unevaluated_runs_count_as_failed() -> None:
    assert loss_of({"status": "diverged", "eval_loss": 3.0}) == INF
    assert loss_of({"status": "completed", "eval_loss": None}) == INF
    assert loss_of({"status": "completed", "eval_loss": float("nan")}) == INF
    assert loss_of({"status": "completed", "eval_loss": 5.25}) == 5.25


def rows(recipe: str, lr: float, losses: list[float], growths: list[float] | None = None) -> list:
    growths = growths or [1.0] * len(losses)
    return [
        {
            "recipe": recipe,
            "lr": lr,
            "seed": s,
            "status": "diverged" if math.isinf(loss) else "completed",
            "eval_loss": None if math.isinf(loss) else loss,
            "act_growth": g,
        }
        for s, (loss, g) in enumerate(zip(losses, growths, strict=True))
    ]


def by_name(data: list[dict], plateau: float = PLATEAU) -> dict:
    return {v.claim.split(" (")[0]: v for v in decide_all(data, plateau)}


def test_verdicts_follow_the_rules() -> None:
    data = [
        *rows("pre", 1e-3, [5.20, 5.25], [1.30, 1.40]),
        *rows("pre", 3e-3, [5.10, 5.15], [1.50, 1.60]),
        *rows("ln_scaling", 1e-3, [5.2, 5.2], [1.00, 1.02]),
        *rows("ln_scaling", 3e-3, [5.1, 5.1], [1.05, 1.10]),
        *rows("peri", 1e-3, [5.3, 5.3], [2.70, 2.80]),
        *rows("peri", 3e-3, [5.3, 5.3], [2.90, 3.00]),
    ]
    found = by_name(data)
    assert set(found) == {
        "Pre-LN activations grow with depth", "LayerNorm Scaling bounds that growth",
        "Peri-LN grows less than Pre-LN",
    }  # fmt: skip
    grows = found["Pre-LN activations grow with depth"]
    assert grows.word == REPRODUCED and grows.why == "min 1.3 >= 1.25"  # all >= 1.25
    bound = found["LayerNorm Scaling bounds that growth"]
    assert bound.word == REPRODUCED
    assert bound.why == "ln_scaling lower than pre at lr 0.001; lr 0.003"
    assert "unigram plateau 6.250 - 0.2" in bound.rule and "ratio x1.25" in bound.rule
    peri = found["Peri-LN grows less than Pre-LN"]
    assert peri.word == CONTRADICTED and peri.why.startswith("peri higher than pre at lr 0.001")
    for v in found.values():  # every line carries its numbers and its rule
        assert v.numbers != "-" and v.rule and v.claim in v.line() and v.rule in v.line()


def test_every_run_diverged_or_on_the_plateau_decides_nothing() -> None:
    for losses in ([INF, INF], [6.24, 6.26]):
        data = [r for n in ("pre", "ln_scaling", "peri") for r in rows(n, 1e-3, losses, [2, 2])]
        found = by_name(data)
        assert {v.word for v in found.values()} == {INCONCLUSIVE}, found
        assert "no grid point where" in found["Peri-LN grows less than Pre-LN"].why
        assert "-> untrained" in found["Peri-LN grows less than Pre-LN"].numbers


def test_one_failed_seed_does_not_carry_a_claim() -> None:
    """One diverged Peri-LN seed: its growth is not compared, the claim decides nothing."""
    data = [*rows("peri", 1e-3, [INF, 5.05], [1.0, 1.0]), *rows("pre", 1e-3, [5.0, 5.0], [2, 2])]
    peri = by_name(data)["Peri-LN grows less than Pre-LN"]
    assert peri.word == INCONCLUSIVE
    assert "-> unclear (a seed did not train)" in peri.numbers


def test_ratio_exactly_met_reproduces() -> None:
    peri = rows("peri", 1e-3, [5.0, 5.0], [1.0, 1.0])
    data = [*peri, *rows("pre", 1e-3, [5.0, 5.0], [1.25, 1.25])]
    assert by_name(data)["Peri-LN grows less than Pre-LN"].word == REPRODUCED
    data = [*peri, *rows("pre", 1e-3, [5.0, 5.0], [1.24, 1.3])]
    assert by_name(data)["Peri-LN grows less than Pre-LN"].word == INCONCLUSIVE


def test_not_tested_is_not_inconclusive() -> None:
    data = [
        *rows("pre", 1e-3, [5.2, 5.3], [1.0, 1.05]),  # flat: not reproduced
        *rows("peri", 1e-2, [5.2, 5.3], [1.0, 1.0]),  # never at pre's learning rates
    ]
    found = by_name(data)
    assert found["Pre-LN activations grow with depth"].word == NOT_REPRODUCED
    ln = found["LayerNorm Scaling bounds that growth"]
    assert ln.word == NOT_TESTED and ln.why == "not run: ln_scaling"
    peri = found["Peri-LN grows less than Pre-LN"]
    assert peri.word == NOT_TESTED and "never ran at the same grid point" in peri.why


def test_growth_claims_need_trained_groups() -> None:
    data = [*rows("peri", 1e-3, [INF, INF], [1.0, 1.0]), *rows("pre", 1e-3, [5.0, 5.0], [2, 2])]
    assert by_name(data)["Peri-LN grows less than Pre-LN"].word == INCONCLUSIVE
    grows = by_name(rows("pre", 1e-3, [6.25, 6.25], [2.0, 2.0]))  # big growth, never trained
    assert grows["Pre-LN activations grow with depth"].word == INCONCLUSIVE


def test_size_axis_groups_points_apart() -> None:
    data = [
        *({**r, "size": 12} for r in rows("peri", 1e-3, [5.0, 5.0], [1.0, 1.0])),
        *({**r, "size": 12} for r in rows("pre", 1e-3, [5.0, 5.0], [2.0, 2.0])),
        *({**r, "size": 4} for r in rows("peri", 1e-3, [5.0, 5.0], [1.0, 1.0])),
        *({**r, "size": 4} for r in rows("pre", 1e-3, [5.0, 5.0], [1.0, 1.1])),
    ]
    assert len(group_rows(data)) == 4
    peri = by_name(data)["Peri-LN grows less than Pre-LN"]
    assert peri.word == INCONCLUSIVE and "size 4, lr 0.001 same" in peri.why
    assert "size 12, lr 0.001: peri 1, 1 vs pre 2, 2 -> lower" in peri.numbers


@pytest.mark.parametrize(
    "kinds, expected",
    [  # the outcome at each lr -> the lower_everywhere verdict, by the module's rules
        ([HIGHER, SAME], CONTRADICTED),
        ([LOWER, SAME], INCONCLUSIVE),
        ([LOWER, LOWER], REPRODUCED),
        ([SAME, SAME], NOT_REPRODUCED),
        ([HIGHER, LOWER], CONTRADICTED),
        ([UNCLEAR, SAME], INCONCLUSIVE),
        ([UNTRAINED, SAME], NOT_REPRODUCED),
        ([UNTRAINED, UNTRAINED], INCONCLUSIVE),
    ],
)
def test_lower_everywhere_over_grid_points(kinds: list[str], expected: str) -> None:
    a = {HIGHER: [2.0, 2.0], LOWER: [1.0, 1.0], SAME: [1.5, 1.5], UNCLEAR: [1.0, 4.0]}
    data = []
    for i, k in enumerate(kinds):
        lr = 1e-3 * (i + 1)
        losses = [INF, INF] if k == UNTRAINED else [5.0, 5.0]
        data += rows("a", lr, losses, a.get(k, [1.0, 1.0])) + rows("b", lr, losses, [1.5, 1.5])
    claim = Claim("claim", "lower_everywhere", "a", "b")
    assert decide(claim, group_rows(data), PLATEAU).word == expected


def test_the_plateau_must_be_a_number() -> None:
    with pytest.raises(ValueError, match="unigram plateau must be a finite loss"):
        decide(CLAIMS[0], {}, math.nan)


def test_rows_without_a_grid_axis_form_one_point() -> None:
    data = [{**r, "lr": None} for r in rows("peri", 1e-3, [5.0, 5.1], [1.0, 1.05])]
    data += [{**r, "lr": None} for r in rows("pre", 1e-3, [5.1, 5.2], [2.0, 2.1])]
    peri = by_name(data)["Peri-LN grows less than Pre-LN"]
    assert peri.word == REPRODUCED and peri.why.endswith("at run")
    assert peri.numbers.startswith("run: peri 1, 1.05 vs pre 2, 2.1")
