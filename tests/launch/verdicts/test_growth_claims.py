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
    compare_loss,
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


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([6.25, 6.26], [5.10, 5.20], HIGHER),  # every seed 1.05+ apart
        ([5.10, 5.20], [6.25, 6.26], LOWER),
        ([5.00, 5.05], [5.02, 5.10], SAME),  # mean gap 0.035 < 0.1
        ([5.00, 6.00], [5.30, 5.40], UNCLEAR),  # mean gap 0.15 but the seeds interleave
        ([INF, INF], [5.0, 5.1], HIGHER),  # both seeds diverged, B trained
        ([INF, INF], [INF, INF], UNTRAINED),  # every run diverged: nothing to compare
        ([6.24, 6.26], [6.25, 6.23], UNTRAINED),  # every run on the plateau
        ([6.20, 6.30], [INF, 6.25], UNTRAINED),  # on the plateau against diverged
        ([INF, 5.05], [5.00, 5.00], UNCLEAR),  # one seed failed, the other inside the margin
        ([5.00, 5.00], [INF, 5.05], UNCLEAR),  # the same, mirrored
        ([5.2, 5.3], [5.1, 5.1], HIGHER),  # the margin exactly met (5.2 - 5.1 in floats)
        ([5.19, 5.3], [5.1, 5.1], UNCLEAR),  # 0.09: not met; mean gap 0.145
        ([5.0, 5.0], [5.1, 5.1], LOWER),  # exactly met, the other way
        ([5.0, 5.01], [5.0, 5.09], SAME),
    ],
)
def test_compare_loss(a: list[float], b: list[float], expected: str) -> None:
    assert compare_loss(a, b, PLATEAU).outcome == expected


def test_one_failed_seed_still_counts_when_it_is_the_worse_side() -> None:
    """A (the side claimed worse) may fail on some seeds: [inf, 5.5] is beyond [5.0, 5.0]."""
    assert compare_loss([INF, 5.10], [5.0, 5.0], PLATEAU).outcome == HIGHER
    assert compare_loss([5.0, 5.0], [INF, 5.10], PLATEAU).outcome == LOWER


def test_three_seeds_may_use_the_stated_test() -> None:
    a, b = [5.6, 5.7, 5.8, 5.35], [5.0, 5.1, 5.2, 5.3]  # min gap 0.05 < 0.1; U of a-0.1 is 15/16
    found = compare_loss(a, b, PLATEAU)
    assert found.outcome == HIGHER and "Mann-Whitney p 0.0286" in found.why
    weaker = [5.6, 5.7, 5.8, 5.25]  # U 14/16: p 4/70 = 0.057 > 0.05
    assert compare_loss(weaker, b, PLATEAU).outcome == UNCLEAR
    two = compare_loss([5.6, 5.35], [5.0, 5.3], PLATEAU)  # 2 seeds: full separation only
    assert two.outcome == UNCLEAR


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
        *rows("post_warmup", 1e-3, [5.50, 5.55]),
        *rows("post_warmup", 3e-3, [5.60, 5.70]),
        *rows("post_nowarmup", 1e-3, [5.52, 5.56]),  # same at 1e-3
        *rows("post_nowarmup", 3e-3, [6.25, 6.26]),  # stalls at 3e-3
        *rows("pre", 1e-3, [5.20, 5.25], [1.30, 1.40]),
        *rows("pre", 3e-3, [5.10, 5.15], [1.50, 1.60]),
        *rows("pre_nowarmup", 1e-3, [5.22, 5.24], [1.3, 1.4]),
        *rows("pre_nowarmup", 3e-3, [5.12, 5.20], [1.5, 1.6]),
        *rows("deepnorm", 1e-3, [5.50, 5.52]),
        *rows("deepnorm", 3e-3, [5.62, 5.66]),
        *rows("ln_scaling", 1e-3, [5.2, 5.2], [1.00, 1.02]),
        *rows("ln_scaling", 3e-3, [5.1, 5.1], [1.05, 1.10]),
        *rows("peri", 1e-3, [5.3, 5.3], [2.70, 2.80]),
        *rows("peri", 3e-3, [5.3, 5.3], [2.90, 3.00]),
    ]
    found = by_name(data)
    warm = found["Warm-up matters for Post-LN"]
    assert warm.word == REPRODUCED
    assert warm.why == "post_nowarmup higher than post_warmup at lr 0.003"
    assert "lr 0.003: post_nowarmup 6.25, 6.26 vs post_warmup 5.6, 5.7 -> higher" in warm.numbers
    assert "unigram plateau 6.250 - 0.2" in warm.rule and "margin 0.1 nats" in warm.rule
    assert found["Pre-LN trains without warm-up"].word == REPRODUCED
    deep = found["DeepNorm stabilises Post-LN"]
    assert deep.word == INCONCLUSIVE and "nothing to stabilise" in deep.why
    assert found["Pre-LN activations grow with depth"].word == REPRODUCED  # all >= 1.25
    assert found["LayerNorm Scaling bounds that growth"].word == REPRODUCED
    peri = found["Peri-LN grows less than Pre-LN"]
    assert peri.word == CONTRADICTED and peri.why.startswith("peri higher than pre at lr 0.001")
    for v in found.values():  # every line carries its numbers and its rule
        assert v.numbers != "-" and v.rule and v.claim in v.line() and v.rule in v.line()


def test_every_run_diverged_or_on_the_plateau_decides_nothing() -> None:
    names = ["post_warmup", "post_nowarmup", "pre", "pre_nowarmup", "deepnorm", "ln_scaling"]
    for losses in ([INF, INF], [6.24, 6.26]):
        data = [r for n in [*names, "peri"] for r in rows(n, 1e-3, losses, [2.0, 2.0])]
        found = by_name(data)
        assert {v.word for v in found.values()} == {INCONCLUSIVE}, found
        assert "no grid point where" in found["Pre-LN trains without warm-up"].why
        assert "-> untrained" in found["Warm-up matters for Post-LN"].numbers


def test_one_failed_seed_does_not_carry_a_claim() -> None:
    """The issue's case: one failed Post-LN seed, the other 0.05 nats from DeepNorm."""
    data = [*rows("post_warmup", 1e-3, [INF, 5.05]), *rows("deepnorm", 1e-3, [5.0, 5.0])]
    deep = by_name(data)["DeepNorm stabilises Post-LN"]
    assert deep.word == INCONCLUSIVE
    assert "post_warmup inf, 5.05 vs deepnorm 5, 5 -> unclear" in deep.numbers
    pre = [*rows("pre_nowarmup", 1e-3, [INF, 5.0]), *rows("pre", 1e-3, [5.0, 5.01])]
    assert by_name(pre)["Pre-LN trains without warm-up"].word == INCONCLUSIVE


def test_margin_exactly_met_reproduces() -> None:
    data = [*rows("post_nowarmup", 1e-3, [5.2, 5.3]), *rows("post_warmup", 1e-3, [5.1, 5.1])]
    assert by_name(data)["Warm-up matters for Post-LN"].word == REPRODUCED
    data = [*rows("post_nowarmup", 1e-3, [5.19, 5.3]), *rows("post_warmup", 1e-3, [5.1, 5.1])]
    assert by_name(data)["Warm-up matters for Post-LN"].word == INCONCLUSIVE


def test_not_tested_is_not_inconclusive() -> None:
    data = [
        *rows("post_warmup", 1e-3, [6.2, 6.3]),
        *rows("post_warmup", 3e-3, [5.0, 5.1]),
        *rows("post_nowarmup", 1e-3, [5.2, 5.3]),  # post_nowarmup lower where warm-up stalled
        *rows("pre", 1e-3, [5.2, 5.3], [1.0, 1.05]),  # flat: not reproduced
        *rows("deepnorm", 1e-2, [5.2, 5.3]),  # never at post_warmup's learning rates
    ]
    found = by_name(data)
    warm = found["Warm-up matters for Post-LN"]  # warm-up stalled, no warm-up trained
    assert warm.word == CONTRADICTED and warm.why.endswith("lower than post_warmup at lr 0.001")
    assert found["Pre-LN activations grow with depth"].word == NOT_REPRODUCED
    pre = found["Pre-LN trains without warm-up"]
    assert pre.word == NOT_TESTED and pre.why == "not run: pre_nowarmup"
    deep = found["DeepNorm stabilises Post-LN"]
    assert deep.word == NOT_TESTED and "never ran at the same grid point" in deep.why


def test_growth_claims_need_trained_groups() -> None:
    data = [*rows("peri", 1e-3, [INF, INF], [1.0, 1.0]), *rows("pre", 1e-3, [5.0, 5.0], [2, 2])]
    assert by_name(data)["Peri-LN grows less than Pre-LN"].word == INCONCLUSIVE
    grows = by_name(rows("pre", 1e-3, [6.25, 6.25], [2.0, 2.0]))  # big growth, never trained
    assert grows["Pre-LN activations grow with depth"].word == INCONCLUSIVE


def test_size_axis_groups_points_apart() -> None:
    data = [
        *({**r, "size": 12} for r in rows("post_nowarmup", 1e-3, [6.25, 6.26])),
        *({**r, "size": 12} for r in rows("post_warmup", 1e-3, [5.1, 5.2])),
        *({**r, "size": 4} for r in rows("post_nowarmup", 1e-3, [5.1, 5.2])),
        *({**r, "size": 4} for r in rows("post_warmup", 1e-3, [5.1, 5.2])),
    ]
    assert len(group_rows(data)) == 4
    warm = by_name(data)["Warm-up matters for Post-LN"]
    assert warm.word == REPRODUCED and warm.why.endswith("at size 12, lr 0.001")
    assert "size 4, lr 0.001: post_nowarmup 5.1, 5.2 vs post_warmup 5.1, 5.2 -> same" in (
        warm.numbers
    )


C = CONTRADICTED


@pytest.mark.parametrize(
    "kinds, worse, never, lower",
    [  # the outcome at each lr -> the verdict of each kind of claim, by the module's rules
        ([HIGHER, SAME], REPRODUCED, C, C),
        ([LOWER, SAME], C, REPRODUCED, INCONCLUSIVE),
        ([LOWER, LOWER], C, REPRODUCED, REPRODUCED),
        ([SAME, SAME], NOT_REPRODUCED, REPRODUCED, NOT_REPRODUCED),
        ([HIGHER, LOWER], INCONCLUSIVE, C, C),
        ([UNCLEAR, SAME], INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE),
        ([UNCLEAR, HIGHER], REPRODUCED, C, C),
        ([UNTRAINED, SAME], NOT_REPRODUCED, REPRODUCED, NOT_REPRODUCED),
        ([UNTRAINED, UNTRAINED], INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE),
    ],
)
def test_claim_kinds_share_one_verdict_rule(
    kinds: list[str], worse: str, never: str, lower: str
) -> None:
    b = {HIGHER: 5.0, LOWER: 5.5, SAME: 5.0, UNCLEAR: 5.0, UNTRAINED: INF}
    a = {HIGHER: [5.5, 5.5], LOWER: [5.0, 5.0], SAME: [5.0, 5.0], UNCLEAR: [5.0, INF]}
    data = []
    for i, k in enumerate(kinds):
        lr = 1e-3 * (i + 1)
        data += rows("a", lr, a.get(k, [INF, INF])) + rows("b", lr, [b[k], b[k]])
    groups = group_rows(data)
    for kind, expected in (
        ("worse_somewhere", worse),
        ("never_worse", never),
        ("lower_everywhere", lower),
    ):
        claim = Claim("claim", kind, "loss", "a", "b")
        assert decide(claim, groups, PLATEAU).word == expected, kind


def test_the_plateau_must_be_a_number() -> None:
    with pytest.raises(ValueError, match="unigram plateau must be a finite loss"):
        decide(CLAIMS[0], {}, math.nan)


def test_rows_without_a_grid_axis_form_one_point() -> None:
    data = [{**r, "lr": None} for r in rows("post_nowarmup", 1e-3, [6.25, 6.26])]
    data += [{**r, "lr": None} for r in rows("post_warmup", 1e-3, [5.1, 5.2])]
    warm = by_name(data)["Warm-up matters for Post-LN"]
    assert warm.word == REPRODUCED and warm.why.endswith("at run")
    assert warm.numbers.startswith("run: post_nowarmup 6.25, 6.26 vs post_warmup 5.1, 5.2")
