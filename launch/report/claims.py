"""The study's verdicts: each literature claim decided over seeds and learning rates by a rule.

Runs are grouped by (recipe, lr); a group's values are its seeds. A loss is the last eval loss
(a diverged or unevaluated run counts as +inf: it did not train). Two groups A and B compare as

- "higher": mean(A) - mean(B) > margin and every seed of A above every seed of B;
- "lower":  the same with A and B swapped;
- "same":   |mean(A) - mean(B)| <= margin;
- "unclear": anything else (a mean gap larger than the margin that the seeds do not separate).

Activation growth (RMS of the last block's output over the first block's, at the last logged step)
compares by ratio instead: "lower" when mean(A) <= mean(B) / GROWTH_RATIO with the seeds separated,
"higher" the mirror image, "same" when the ratio of means lies within GROWTH_RATIO either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

LOSS_MARGIN = 0.1  # nats of eval loss: smaller gaps count as the same
GROWTH_RATIO = 1.25  # activation-growth ratios within 1/1.25 .. 1.25 count as the same
GROWS = 1.25  # "grows with depth": every seed's last-block RMS >= 1.25 x the first block's
FLAT = 1.1  # "does not grow": mean last/first RMS below 1.1

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"

Groups = dict[tuple[str, float], list[dict[str, Any]]]


def group_rows(rows: list[dict[str, Any]]) -> Groups:
    """Summary rows (with 'recipe' and 'lr') grouped by (recipe, lr), seeds in row order."""
    groups: Groups = {}
    for row in rows:
        groups.setdefault((str(row["recipe"]), float(row["lr"])), []).append(row)
    return groups


def loss_of(row: dict[str, Any]) -> float:
    value = row.get("eval_loss")
    if row.get("status") == "diverged" or value is None or not math.isfinite(value):
        return math.inf
    return float(value)


def growth_of(row: dict[str, Any]) -> float:
    value = row.get("act_growth")
    return math.nan if value is None else float(value)


def compare_loss(a: list[float], b: list[float], margin: float = LOSS_MARGIN) -> str:
    """'higher' / 'lower' / 'same' / 'unclear' of A's losses against B's (module docstring)."""
    ma, mb = float(np.mean(a)), float(np.mean(b))
    if math.isinf(ma) and math.isinf(mb):
        return "same"  # both failed
    if ma - mb > margin and min(a) > max(b):
        return "higher"
    if mb - ma > margin and min(b) > max(a):
        return "lower"
    return "same" if abs(ma - mb) <= margin else "unclear"


def compare_growth(a: list[float], b: list[float], ratio: float = GROWTH_RATIO) -> str:
    if any(math.isnan(v) for v in [*a, *b]):
        return "unclear"
    ma, mb = float(np.mean(a)), float(np.mean(b))
    if ma >= mb * ratio and min(a) > max(b):
        return "higher"
    if ma * ratio <= mb and max(a) < min(b):
        return "lower"
    return "same" if mb / ratio < ma < mb * ratio else "unclear"


@dataclass
class Verdict:
    claim: str
    rule: str
    evidence: str  # per learning rate, what the comparison found
    verdict: str


def _pairs(groups: Groups, a: str, b: str) -> list[float]:
    """Learning rates at which both recipes ran."""
    lrs_a = {lr for r, lr in groups if r == a}
    return sorted(lr for lr in lrs_a if (b, lr) in groups)


def _per_lr(
    groups: Groups, a: str, b: str, value: Callable[[dict[str, Any]], float], how: Callable
) -> dict[float, tuple[str, float, float]]:
    out = {}
    for lr in _pairs(groups, a, b):
        va = [value(r) for r in groups[(a, lr)]]
        vb = [value(r) for r in groups[(b, lr)]]
        out[lr] = (how(va, vb), float(np.mean(va)), float(np.mean(vb)))
    return out


def _evidence(found: dict[float, tuple[str, float, float]], a: str, b: str) -> str:
    return "; ".join(
        f"lr {lr:g}: {a} {ma:.3g} vs {b} {mb:.3g} ({k})" for lr, (k, ma, mb) in found.items()
    )


def _missing(claim: str, rule: str, *recipes: str) -> Verdict:
    return Verdict(claim, rule, f"needs recipes {', '.join(recipes)} at a common lr", INCONCLUSIVE)


def _judge(
    claim: str, rule: str, found: dict, a: str, b: str, holds: bool, against: str | None
) -> Verdict:
    """The shared verdict: reproduced when the claim's rule holds; contradicted when `against`
    ('higher' or 'lower', A against B) was found instead; not reproduced when every lr came out
    'same'; inconclusive otherwise."""
    kinds = [k for k, _, _ in found.values()]
    if holds:
        verdict = REPRODUCED
    elif against is not None:
        verdict = f"{NOT_REPRODUCED} (contradicted: {a} {against} than {b})"
    elif kinds and all(k == "same" for k in kinds):
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return Verdict(claim, rule, _evidence(found, a, b), verdict)


def worse_somewhere(claim: str, rule: str, found: dict, a: str, b: str) -> Verdict:
    """A claim that A is worse than B (higher) at some lr and better nowhere."""
    kinds = {k for k, _, _ in found.values()}
    holds = "higher" in kinds and "lower" not in kinds
    against = "lower" if "lower" in kinds and "higher" not in kinds else None
    return _judge(claim, rule, found, a, b, holds, against)


def never_worse(claim: str, rule: str, found: dict, a: str, b: str) -> Verdict:
    """A claim that A is as good as B (same or lower) at every lr."""
    kinds = {k for k, _, _ in found.values()}
    holds = kinds <= {"same", "lower"}
    return _judge(claim, rule, found, a, b, holds, "higher" if "higher" in kinds else None)


def lower_everywhere(claim: str, rule: str, found: dict, a: str, b: str) -> Verdict:
    """A claim that A is lower than B at every lr."""
    kinds = {k for k, _, _ in found.values()}
    holds = kinds == {"lower"}
    return _judge(claim, rule, found, a, b, holds, "higher" if "higher" in kinds else None)


def pre_growth(groups: Groups, recipe: str = "pre") -> Verdict:
    claim = "Pre-LN activations grow with depth (Sun et al. 2025; Kim et al. 2025)"
    rule = (
        f"every seed at every lr has last/first block RMS >= {GROWS} (reproduced); mean below "
        f"{FLAT} at every lr (not reproduced)"
    )
    per_lr = {
        lr: [growth_of(r) for r in rows] for (name, lr), rows in groups.items() if name == recipe
    }
    if not per_lr:
        return Verdict(claim, rule, f"needs recipe {recipe}", INCONCLUSIVE)
    evidence = "; ".join(
        f"lr {lr:g}: {recipe} growth {np.mean(v):.3g} (seeds {', '.join(f'{x:.3g}' for x in v)})"
        for lr, v in sorted(per_lr.items())
    )
    values = [v for vs in per_lr.values() for v in vs]
    if all(v >= GROWS for v in values):
        verdict = REPRODUCED
    elif all(np.mean(v) < FLAT for v in per_lr.values()):
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return Verdict(claim, rule, evidence, verdict)


def verdicts(groups: Groups) -> list[Verdict]:
    """Every claim the study decides, in the order of SCIENCE.md section 3."""
    loss = f"last eval loss, margin {LOSS_MARGIN} nats, seeds separated"
    growth = f"last/first block RMS, ratio {GROWTH_RATIO}, seeds separated"
    specs = [
        (
            "Warm-up matters for Post-LN (Xiong et al. 2020)",
            f"post_nowarmup higher than post_warmup at some lr, lower at none ({loss})",
            "post_nowarmup",
            "post_warmup",
            loss_of,
            compare_loss,
            worse_somewhere,
        ),
        (
            "Pre-LN trains without warm-up (Xiong et al. 2020)",
            f"pre_nowarmup not higher than pre (with warm-up) at any lr ({loss})",
            "pre_nowarmup",
            "pre",
            loss_of,
            compare_loss,
            never_worse,
        ),
        (
            "DeepNorm stabilises Post-LN (Wang et al. 2022)",
            f"post_warmup higher than deepnorm (same warm-up) at some lr, lower at none ({loss})",
            "post_warmup",
            "deepnorm",
            loss_of,
            compare_loss,
            worse_somewhere,
        ),
        None,  # Pre-LN growth: one recipe against thresholds, not a pair
        (
            "LayerNorm Scaling bounds that growth (Sun et al. 2025)",
            f"ln_scaling's growth lower than pre's at every lr ({growth})",
            "ln_scaling",
            "pre",
            growth_of,
            compare_growth,
            lower_everywhere,
        ),
        (
            "Peri-LN grows less than Pre-LN (Kim et al. 2025)",
            f"peri's growth lower than pre's at every lr ({growth})",
            "peri",
            "pre",
            growth_of,
            compare_growth,
            lower_everywhere,
        ),
    ]
    out = []
    for spec in specs:
        if spec is None:
            out.append(pre_growth(groups))
            continue
        claim, rule, a, b, value, how, decide = spec
        found = _per_lr(groups, a, b, value, how)
        out.append(decide(claim, rule, found, a, b) if found else _missing(claim, rule, a, b))
    deepnorm = out[2]
    if deepnorm.verdict == NOT_REPRODUCED:  # Post-LN never failed: nothing was there to stabilise
        deepnorm.verdict = f"{INCONCLUSIVE} (Post-LN trained as well as DeepNorm at every lr)"
    return out
