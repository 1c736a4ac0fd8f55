"""The study's verdicts: each literature claim decided over seeds and grid points by a stated rule.

The descriptive growth claims of a study without claims of its own.

API (what `normlab study` calls):

    plateau = dataset_unigram_loss(data_dir)          # launch.study.unigram
    found = decide_all(rows, plateau)                 # list[Verdict], in the order of CLAIMS
    one = decide(CLAIMS[0], group_rows(rows), plateau)
    print(one.line())                                 # claim: word (why); numbers; rule

`rows` are compare's summary rows (launch.report.table.summarize) with at least 'recipe', 'lr',
'status', 'eval_loss' and, for growth claims, 'act_growth'; a row may carry a 'size' (any
hashable: n_layers, a preset name) and then groups are per (recipe, size, lr), and an
'init_loss' (l_0, the eval loss of the initialised model; launch.study.report fills it).

Which loss a run counts at (`loss_of`; the same rule as the LR-sensitivity protocol,
launch.lr_sensitivity.curves, and SCIENCE.md 19): min(final eval loss, l_0) when its status is
'completed' and that loss is finite; l_0 for every other run: diverged, failed, stopped
(interrupted, preempted), never evaluated. A row without a finite l_0 takes the mean of the
finite ones of its (recipe, size) (`fill_l0`); with none at all, such a run counts as +inf (it
did not train either way: l_0 and inf both lie above the plateau). A row's seeds are
the rows sharing its recipe and grid point. A Verdict has `claim`, `word`, `why` (one line),
`rule` (the rule it was decided by, numbers included) and `numbers` (per grid point: every
seed's value and the comparison's outcome). Words:

- "reproduced" / "not reproduced" / "contradicted" (the opposite was found) / "inconclusive";
- "not tested": a recipe the claim needs was not run, or not at a grid point the other ran at.

Per grid point the two groups compare by launch.stats.separation's ratio rule on the last
block's residual RMS over the first's (act_growth), and only groups that trained (every seed
below the data's unigram plateau by TRAINED_MARGIN) take part: "higher"/"lower" need every seed
beyond every seed by the ratio (or >= 3 seeds a side and a one-sided Mann-Whitney test at
ALPHA), points where nothing trained are "untrained" and decide nothing. Then, over the points
that trained:

- lower everywhere (A below B): contradicted when "higher" anywhere; reproduced when all
  "lower"; not reproduced when all "same";
- grows (one recipe): reproduced when every seed at every point has growth >= GROWS; not
  reproduced when every point's mean is below FLAT;
- anything else, or no point that trained: inconclusive.

The loss claims these rules once also decided (warm-up, DeepNorm) are decided by SCIENCE.md 22
(launch/verdicts/decide.py): each recipe at its own best learning rate, over seeds, with Holm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from normlab.launch.lr_sensitivity.curves import capped_loss, counts_as_l0
from normlab.launch.metric_keys import ACT_GROWTH
from normlab.launch.stats.separation import (
    ALPHA,
    GROWTH_RATIO,
    HIGHER,
    LOWER,
    MIN_TEST_SEEDS,
    SAME,
    TRAINED_MARGIN,
    UNCLEAR,
    UNTRAINED,
    Comparison,
    compare_ratio,
    trained,
)

GROWS = 1.25  # "grows with depth": every seed's last-block RMS >= 1.25 x the first block's
FLAT = 1.1  # "does not grow": mean last/first RMS below 1.1
AXES = ("size", "lr")  # the grid axes a row may carry, outermost first

REPRODUCED, NOT_REPRODUCED, CONTRADICTED = "reproduced", "not reproduced", "contradicted"
INCONCLUSIVE, NOT_TESTED = "inconclusive", "not tested"

Point = tuple[tuple[str, Any], ...]  # (("size", 12), ("lr", 0.001))
Groups = dict[tuple[str, Point], list[dict[str, Any]]]


@dataclass(frozen=True)
class Claim:
    name: str
    kind: str  # "lower_everywhere" | "grows"
    a: str
    b: str | None = None


CLAIMS = [
    Claim("Pre-LN activations grow with depth (Sun et al. 2025; Kim et al. 2025)", "grows", "pre"),
    Claim("LayerNorm Scaling bounds that growth (Sun et al. 2025)", "lower_everywhere",
          "ln_scaling", "pre"),
    Claim("Peri-LN grows less than Pre-LN (Kim et al. 2025)", "lower_everywhere", "peri", "pre"),
]  # fmt: skip

CLAIM_RULES = {
    "lower_everywhere": "{a} lower than {b} at every point that trained",
    "grows": "every seed of {a} at every point has last/first block RMS >= "
    f"{GROWS:g} (reproduced); every point's mean below {FLAT:g} (not reproduced)",
}


@dataclass
class Verdict:
    claim: str
    word: str
    why: str
    rule: str
    numbers: str

    def line(self) -> str:
        return f"{self.claim}: {self.word} ({self.why}); {self.numbers}; rule: {self.rule}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def loss_of(row: dict[str, Any]) -> float:
    """The loss the run counts at (module docstring): min(last eval loss, l_0) for a completed
    run, l_0 for any other (diverged, failed, stopped, unevaluated); +inf in place of an unknown
    l_0."""
    value = row.get("eval_loss")
    loss = float(value) if _finite(value) else None
    l0 = float(row["init_loss"]) if _finite(row.get("init_loss")) else math.inf
    return capped_loss(loss, l0, counts_as_l0(row.get("status"), loss))


def fill_l0(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the rows whose missing or non-finite 'init_loss' is the mean of the finite ones
    of the same (recipe, size) (the sensitivity protocol's rule); left as is where none is."""
    found: dict[tuple[str, Any], list[float]] = {}
    for row in rows:
        if _finite(row.get("init_loss")):
            found.setdefault((str(row["recipe"]), row.get("size")), []).append(row["init_loss"])
    out = []
    for row in rows:
        known = found.get((str(row["recipe"]), row.get("size")))
        if not _finite(row.get("init_loss")) and known:
            row = {**row, "init_loss": float(np.mean(known))}
        out.append(row)
    return out


def growth_of(row: dict[str, Any]) -> float:
    value = row.get(ACT_GROWTH)
    return math.nan if value is None else float(value)


def point_of(row: dict[str, Any]) -> Point:
    return tuple((axis, row[axis]) for axis in AXES if row.get(axis) is not None)


def group_rows(rows: list[dict[str, Any]]) -> Groups:
    """Summary rows grouped by (recipe, grid point), seeds in row order."""
    groups: Groups = {}
    for row in rows:
        point = tuple((k, float(v) if k == "lr" else v) for k, v in point_of(row))
        groups.setdefault((str(row["recipe"]), point), []).append(row)
    return groups


def point_label(point: Point) -> str:
    """'size 12, lr 0.001'; 'run' for rows that carry no grid axis."""
    text = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in point)
    return text or "run"


def comparison_rule(plateau: float) -> str:
    """The per-point rule, with its constants and the plateau it used."""
    return (
        f"last/first block RMS of groups that trained, ratio x{GROWTH_RATIO:g}; "
        f"trained: every seed <= unigram plateau {plateau:.3f} - {TRAINED_MARGIN:g}; "
        f"higher/lower: every seed beyond every seed by the margin, or >= {MIN_TEST_SEEDS} "
        f"seeds a side and one-sided Mann-Whitney p <= {ALPHA:g}; same: both trained, means "
        "within the margin"
    )


def _points(groups: Groups, recipe: str) -> list[Point]:
    return sorted(p for r, p in groups if r == recipe)


def _compare(claim: Claim, ra: list[dict], rb: list[dict], plateau: float) -> Comparison:
    la, lb = [loss_of(r) for r in ra], [loss_of(r) for r in rb]
    ga, gb = [growth_of(r) for r in ra], [growth_of(r) for r in rb]
    ta, tb = [trained(v, plateau) for v in la], [trained(v, plateau) for v in lb]
    if not any(ta) and not any(tb):
        return Comparison(UNTRAINED, tuple(ga), tuple(gb), "no seed trained")
    if not (all(ta) and all(tb)):
        return Comparison(UNCLEAR, tuple(ga), tuple(gb), "a seed did not train")
    return compare_ratio(ga, gb)


def _seeds(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def _pair_verdict(claim: Claim, found: dict[Point, Comparison]) -> tuple[str, str]:
    """(word, why) from the outcome at each point (module docstring)."""
    tested = {p: c.outcome for p, c in found.items() if c.outcome != UNTRAINED}
    kinds = set(tested.values())
    where = {k: [point_label(p) for p, o in tested.items() if o == k] for k in kinds}

    def at(kind: str) -> str:
        return f"{claim.a} {kind} than {claim.b} at {'; '.join(where[kind])}"

    if not tested:
        return INCONCLUSIVE, "no grid point where the groups trained"
    if HIGHER in kinds:
        return CONTRADICTED, at(HIGHER)
    if kinds == {LOWER}:
        return REPRODUCED, at(LOWER)
    if kinds == {SAME}:
        return NOT_REPRODUCED, f"{claim.a} same as {claim.b} at every point that trained"
    return INCONCLUSIVE, "outcomes " + "; ".join(f"{point_label(p)} {o}" for p, o in tested.items())


def _decide_pair(claim: Claim, groups: Groups, plateau: float) -> Verdict:
    assert claim.b is not None
    what = CLAIM_RULES[claim.kind].format(a=claim.a, b=claim.b)
    rule = f"{what} ({comparison_rule(plateau)})"
    pa, pb = _points(groups, claim.a), _points(groups, claim.b)
    missing = [r for r, ps in ((claim.a, pa), (claim.b, pb)) if not ps]
    if missing:
        return Verdict(claim.name, NOT_TESTED, f"not run: {', '.join(missing)}", rule, "-")
    common = [p for p in pa if p in set(pb)]
    if not common:
        why = f"{claim.a} and {claim.b} never ran at the same grid point"
        return Verdict(claim.name, NOT_TESTED, why, rule, "-")
    found = {
        p: _compare(claim, groups[(claim.a, p)], groups[(claim.b, p)], plateau) for p in common
    }
    numbers = "; ".join(
        f"{point_label(p)}: {claim.a} {_seeds(c.a)} vs {claim.b} {_seeds(c.b)} -> "
        f"{c.outcome} ({c.why})"
        for p, c in found.items()
    )
    word, why = _pair_verdict(claim, found)
    return Verdict(claim.name, word, why, rule, numbers)


def _decide_grows(claim: Claim, groups: Groups, plateau: float) -> Verdict:
    rule = (
        f"{CLAIM_RULES['grows'].format(a=claim.a)}, over points where every seed trained "
        f"(<= unigram plateau {plateau:.3f} - {TRAINED_MARGIN:g})"
    )
    points = _points(groups, claim.a)
    if not points:
        return Verdict(claim.name, NOT_TESTED, f"not run: {claim.a}", rule, "-")
    values, parts = {}, []
    for p in points:
        rows = groups[(claim.a, p)]
        growth = [growth_of(r) for r in rows]
        ok = all(trained(loss_of(r), plateau) for r in rows)
        parts.append(
            f"{point_label(p)}: {claim.a} growth {_seeds(tuple(growth))}"
            + ("" if ok else " (a seed did not train: left out)")
        )
        if ok:
            values[p] = growth
    numbers = "; ".join(parts)
    flat = [v for vs in values.values() for v in vs]
    if not values:
        return Verdict(claim.name, INCONCLUSIVE, "no grid point where every seed trained", rule,
                       numbers)  # fmt: skip
    if all(v >= GROWS for v in flat):
        word, why = REPRODUCED, f"min {min(flat):.3g} >= {GROWS:g}"
    elif all(float(np.mean(v)) < FLAT for v in values.values()):
        worst = max(float(np.mean(v)) for v in values.values())
        word, why = NOT_REPRODUCED, f"largest mean {worst:.3g} < {FLAT:g}"
    else:
        word, why = INCONCLUSIVE, f"seeds from {min(flat):.3g} to {max(flat):.3g}"
    return Verdict(claim.name, word, why, rule, numbers)


def decide(claim: Claim, groups: Groups, plateau: float) -> Verdict:
    """One claim's verdict over the groups, `plateau` the data's unigram loss (nats)."""
    if not math.isfinite(plateau):
        raise ValueError(f"the unigram plateau must be a finite loss, got {plateau}")
    if claim.kind == "grows":
        return _decide_grows(claim, groups, plateau)
    return _decide_pair(claim, groups, plateau)


def decide_all(
    rows: list[dict[str, Any]], plateau: float, claims: list[Claim] | None = None
) -> list[Verdict]:
    """Every claim (default CLAIMS, the order of SCIENCE.md section 3) over the summary rows
    (a row's missing l_0 filled by `fill_l0`)."""
    groups = group_rows(fill_l0(rows))
    return [decide(c, groups, plateau) for c in claims or CLAIMS]
