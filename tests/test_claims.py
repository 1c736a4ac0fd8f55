"""The study's verdict rules on hand-made seed values whose outcome is decided by hand."""

from __future__ import annotations

import math

import pytest
from normlab.launch.report.claims import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    compare_growth,
    compare_loss,
    group_rows,
    loss_of,
    lower_everywhere,
    never_worse,
    verdicts,
    worse_somewhere,
)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([6.25, 6.26], [5.10, 5.20], "higher"),  # gap 1.1, seeds separated
        ([5.10, 5.20], [6.25, 6.26], "lower"),
        ([5.00, 5.05], [5.02, 5.10], "same"),  # gap 0.035 <= 0.1
        ([5.00, 6.00], [5.30, 5.40], "unclear"),  # gap 0.15 but the seeds interleave
        ([math.inf, math.inf], [5.0, 5.1], "higher"),  # both seeds diverged
        ([math.inf, math.inf], [math.inf, math.inf], "same"),
    ],
)
def test_compare_loss(a: list[float], b: list[float], expected: str) -> None:
    assert compare_loss(a, b) == expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([1.00, 1.05], [1.50, 1.60], "lower"),  # ratio 1.51 >= 1.25, separated
        ([2.70, 2.80], [1.30, 1.40], "higher"),
        ([1.30, 1.40], [1.35, 1.45], "same"),
        ([0.8, 1.6], [1.5, 1.6], "unclear"),  # ratio 1.29 but the seeds overlap
        ([math.nan, 1.0], [1.5, 1.6], "unclear"),
    ],
)
def test_compare_growth(a: list[float], b: list[float], expected: str) -> None:
    assert compare_growth(a, b) == expected


def test_diverged_or_unevaluated_runs_count_as_failed() -> None:
    assert loss_of({"status": "diverged", "eval_loss": 3.0}) == math.inf
    assert loss_of({"status": "completed", "eval_loss": None}) == math.inf
    assert loss_of({"status": "completed", "eval_loss": float("nan")}) == math.inf
    assert loss_of({"status": "completed", "eval_loss": 5.25}) == 5.25


def rows(recipe: str, lr: float, losses: list[float], growths: list[float]) -> list[dict]:
    return [
        {
            "recipe": recipe,
            "lr": lr,
            "seed": s,
            "status": "completed",
            "eval_loss": loss,
            "act_growth": g,
        }
        for s, (loss, g) in enumerate(zip(losses, growths, strict=True))
    ]


def test_verdicts_follow_the_rules() -> None:
    data = [
        *rows("post_warmup", 1e-3, [5.50, 5.55], [1.0, 1.0]),
        *rows("post_warmup", 3e-3, [5.60, 5.70], [1.0, 1.0]),
        *rows("post_nowarmup", 1e-3, [5.52, 5.56], [1.0, 1.0]),  # same at 1e-3
        *rows("post_nowarmup", 3e-3, [6.25, 6.26], [1.0, 1.0]),  # stalls at 3e-3
        *rows("pre", 1e-3, [5.20, 5.25], [1.30, 1.40]),
        *rows("pre", 3e-3, [5.10, 5.15], [1.50, 1.60]),
        *rows("pre_nowarmup", 1e-3, [5.22, 5.24], [1.3, 1.4]),
        *rows("pre_nowarmup", 3e-3, [5.12, 5.20], [1.5, 1.6]),
        *rows("deepnorm", 1e-3, [5.50, 5.52], [1.0, 1.0]),
        *rows("deepnorm", 3e-3, [5.62, 5.66], [1.0, 1.0]),
        *rows("ln_scaling", 1e-3, [5.2, 5.2], [1.00, 1.02]),
        *rows("ln_scaling", 3e-3, [5.1, 5.1], [1.05, 1.10]),
        *rows("peri", 1e-3, [5.3, 5.3], [2.70, 2.80]),
        *rows("peri", 3e-3, [5.3, 5.3], [2.90, 3.00]),
    ]
    found = {v.claim.split(" (")[0]: v for v in verdicts(group_rows(data))}
    assert found["Warm-up matters for Post-LN"].verdict == REPRODUCED
    assert "lr 0.003: post_nowarmup 6.25 vs post_warmup 5.65 (higher)" in (
        found["Warm-up matters for Post-LN"].evidence
    )
    assert found["Pre-LN trains without warm-up"].verdict == REPRODUCED
    assert found["DeepNorm stabilises Post-LN"].verdict.startswith(INCONCLUSIVE)  # nothing failed
    assert found["Pre-LN activations grow with depth"].verdict == REPRODUCED  # all >= 1.25
    assert found["LayerNorm Scaling bounds that growth"].verdict == REPRODUCED
    peri = found["Peri-LN grows less than Pre-LN"].verdict
    assert peri == f"{NOT_REPRODUCED} (contradicted: peri higher than pre)"


def test_contradiction_and_missing_recipes() -> None:
    data = [
        *rows("post_warmup", 1e-3, [6.2, 6.3], [1.0, 1.0]),  # warm-up worse than none
        *rows("post_nowarmup", 1e-3, [5.2, 5.3], [1.0, 1.0]),
        *rows("pre", 1e-3, [5.2, 5.3], [1.0, 1.05]),  # flat: not reproduced
    ]
    found = {v.claim.split(" (")[0]: v for v in verdicts(group_rows(data))}
    assert found["Warm-up matters for Post-LN"].verdict.startswith(
        f"{NOT_REPRODUCED} (contradicted"
    )
    assert found["Pre-LN activations grow with depth"].verdict == NOT_REPRODUCED
    assert found["Pre-LN trains without warm-up"].verdict == INCONCLUSIVE
    assert "needs recipes pre_nowarmup, pre" in found["Pre-LN trains without warm-up"].evidence


C = f"{NOT_REPRODUCED} (contradicted: a {{}} than b)"


@pytest.mark.parametrize(
    "kinds, worse, never, lower",
    [  # the comparison at each lr -> the verdict of each kind of claim, by the module's rules
        (["higher", "same"], REPRODUCED, C.format("higher"), C.format("higher")),
        (["lower", "same"], C.format("lower"), REPRODUCED, INCONCLUSIVE),
        (["lower", "lower"], C.format("lower"), REPRODUCED, REPRODUCED),
        (["same", "same"], NOT_REPRODUCED, REPRODUCED, NOT_REPRODUCED),
        (["higher", "lower"], INCONCLUSIVE, C.format("higher"), C.format("higher")),
        (["unclear", "same"], INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE),
        (["unclear", "higher"], REPRODUCED, C.format("higher"), C.format("higher")),
    ],
)
def test_claim_kinds_share_one_verdict_rule(
    kinds: list[str], worse: str, never: str, lower: str
) -> None:
    found = {1e-3 * (i + 1): (k, 5.0, 5.0) for i, k in enumerate(kinds)}
    for decide, expected in (
        (worse_somewhere, worse),
        (never_worse, never),
        (lower_everywhere, lower),
    ):
        assert decide("claim", "rule", found, "a", "b").verdict == expected, decide.__name__
