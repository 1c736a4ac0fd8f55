"""Verdicts on a table of runs (SCIENCE.md 22): the pre-registered family, Holm, the numbers.

The family: for every (recipe pair, size) three claims, or the claims a file states (Claim):
(a) loss at each recipe's own best LR, leave-one-seed-out cross-fitted (Welch with each arm's
jackknife variance of the cross-fitted mean, docs/SCIENCE.md 22; the naive min_eta mean is
reported beside it, and the exact permutation test that redoes the selection in every relabelling
wherever its floor reaches the level; beyond statistics.EXACT_LIMIT relabellings a sequential
Monte-Carlo p with its MC error, skipped where Welch decides: launch.verdicts.permutation_mc),
(b) LR sensitivity per seed S_R(s) (Welch), (c) trained LR range per seed W_R(s) (needs the
plateau; the exact permutation test is its only test).
Per-seed statistics: launch.verdicts.family. **A diverged, failed or stopped run counts as l_0, the
initial loss, for every statistic** (and so does a non-finite final loss); an unknown l_0 that a
run needs makes the claim undecidable (a note), never an exception.

Holm runs over every claim of the report that can be tested (>= 2 complete seed-runs per arm, l_0
known where needed, the plateau for (c)); the others are 'inconclusive' with the reason ("needs
>= 2 seeds") or 'not_tested' (recipes not run, no plateau). Nothing is decided from one seed.
Where the permutation floor 1/C(n_a+n_b, n_a) exceeds the claim's level the verdict says
"verdict impossible at n = k: needs n >= ...". Every verdict carries its means, delta, interval,
level, p, rule, test and the seeds per arm for 80 % power at the observed spread (22.5): for (a)
simulated through the test itself (launch.verdicts.power), for (b) and (c) the noncentral t.
A decided verdict carries what it means (Verdict.meaning: lower by more than the margin, or
within it); an inconclusive one says the seed-runs it needs next (needs_next).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
from normlab.launch.errors import ConfigError
from normlab.launch.progress import Stages
from normlab.launch.stats import group_sequential as gs
from normlab.launch.stats import statistics as st
from normlab.launch.stats.permutation_counts import integer_interval, integer_valued
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.permutation_mc import exact_in_reach, mc_min_p, skipped_note
from normlab.launch.verdicts.power import (
    MAX_SIMULATED,
    ArmModel,
    seeds_for_cells,
    seeds_for_models,
)
from normlab.launch.verdicts.results_table import Cell
from normlab.launch.verdicts.workers import fan_out

EXPECTS = (st.A_LOWER, st.B_LOWER, st.EQUIVALENT, "any")
NOT_TESTED = "not_tested"


@dataclass(frozen=True)
class Claim:
    """A claim as data: recipe a against recipe b on one statistic; size None: every size both
    ran. `expect` is what the claim says (any: no direction stated)."""

    a: str
    b: str
    statistic: str
    expect: str = "any"
    size: str | None = None
    name: str = ""  # what the claim says in words ("DeepNorm stabilises Post-LN (Wang 2022)")

    def __post_init__(self) -> None:
        if self.statistic not in vc.STATISTICS:
            raise ConfigError(f"statistic {self.statistic!r} is not one of {vc.STATISTICS}")
        if self.expect not in EXPECTS:
            raise ConfigError(f"expect {self.expect!r} is not one of {EXPECTS}")
        if self.a == self.b:
            raise ConfigError(f"a claim compares two recipes, got {self.a!r} twice")


@dataclass
class Verdict:
    a: str
    b: str
    size: str
    statistic: str
    expect: str
    verdict: str
    claim: str = ""  # the claim's name, when it has one
    test: str = ""
    n_a: int = 0
    n_b: int = 0
    mean_a: float = math.nan
    mean_b: float = math.nan
    delta: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    level: float = math.nan
    p: float = math.nan
    margin: float = math.nan
    sd: float = math.nan
    seeds_needed: int | None = None
    p_permutation: float | None = None
    p_permutation_se: float | None = None  # its Monte-Carlo SE where it was resampled
    permutation_note: str = ""  # how p_permutation was found where not exactly (or why not)
    naive_a: float | None = None  # (a) only: min_eta mean loss, in-sample
    naive_b: float | None = None
    best_lr_a: float | None = None  # (a) only: argmin of the all-seed mean
    best_lr_b: float | None = None
    rule: str = ""
    note: str = ""
    pick_a: list[int] = field(default_factory=list)  # (a): cross-fitted lr index per seed
    pick_b: list[int] = field(default_factory=list)

    @property
    def seed_limit(self) -> int:
        """The largest count the seed calculator searches: claim (a)'s simulation stops at
        MAX_SIMULATED per arm, the noncentral t at statistics.MAX_SEEDS."""
        return MAX_SIMULATED if self.statistic == vc.LOSS else st.MAX_SEEDS

    @property
    def meaning(self) -> str:
        """What a decided verdict says, with its margin ('' when undecided): a directional one
        means lower by more than the margin, not merely lower."""
        unit = "grid steps" if self.statistic == vc.RANGE else "nats"
        lower = {st.A_LOWER: (self.a, self.b), st.B_LOWER: (self.b, self.a)}
        if self.verdict in lower:
            low, high = lower[self.verdict]
            return f"{low} lower than {high} by more than {self.margin:g} {unit}"
        if self.verdict == st.EQUIVALENT:
            return f"{self.a} and {self.b} within ±{self.margin:g} {unit}"
        return ""

    @property
    def agrees(self) -> str:
        if self.verdict in (NOT_TESTED, st.INCONCLUSIVE):
            return "undecided"
        if self.expect == "any":
            return "-"
        return "as expected" if self.verdict == self.expect else "contrary"


CLAIM_KEYS = ("a", "b", "statistic", "expect", "size", "name")


def load_claims(path: str | Path) -> list[Claim]:
    """The claims file: a YAML list of {a, b, statistic, expect?, size?, name?}."""
    from normlab.launch.config.loader import read_strict_yaml

    path = Path(path)
    data = read_strict_yaml(path, "claims file")  # the one YAML reader: UTF-8, no key twice
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: the claims file must be a non-empty YAML list")
    return claims_from_data(data, f"{path}: ")


def claims_from_data(data: list, where: str = "") -> list[Claim]:
    """Claims from parsed YAML (a claims file, or a study file's `claims:`); a bad entry is one
    ConfigError line naming the claim's number and the key."""
    claims = []
    for i, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise ConfigError(f"{where}claim {i} is not a mapping with keys {list(CLAIM_KEYS)}")
        unknown = sorted(str(k) for k in set(item) - set(CLAIM_KEYS))
        missing = [k for k in ("a", "b", "statistic") if k not in item]
        if unknown or missing:
            what = (
                f"unknown key {unknown[0]!r}; allowed: {', '.join(CLAIM_KEYS)}"
                if unknown
                else f"missing {', '.join(missing)}"
            )
            raise ConfigError(f"{where}claim {i}: {what}")
        size = item.get("size")
        try:
            claims.append(
                Claim(
                    str(item["a"]),
                    str(item["b"]),
                    str(item["statistic"]),
                    str(item.get("expect", "any")),
                    None if size is None else str(size),
                    str(item.get("name") or ""),
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"{where}claim {i}: {exc}") from None
    _refuse_twice(claims, where)
    return claims


def _refuse_twice(claims: list[Claim], where: str) -> None:
    """A comparison claimed twice (the same pair, either order, and statistic at an overlapping
    size: no size means every size) or a name given twice would enter the Holm family twice,
    weakening every other claim's correction: refused, naming both claims."""
    for j, later in enumerate(claims):
        for i, earlier in enumerate(claims[:j]):
            same_pair = {earlier.a, earlier.b} == {later.a, later.b}
            overlap = earlier.size is None or later.size is None or earlier.size == later.size
            if same_pair and earlier.statistic == later.statistic and overlap:
                raise ConfigError(
                    f"{where}claim {j + 1} repeats claim {i + 1} ({later.a} vs {later.b}, "
                    f"{later.statistic}, size {later.size or 'any'}): list each comparison once"
                )
            if later.name and later.name == earlier.name:
                raise ConfigError(
                    f"{where}claim {j + 1}: name {later.name!r} is already claim {i + 1}'s"
                )


def default_claims(cells: dict[tuple[str, str], Cell]) -> list[Claim]:
    """Every pair of recipes (in order of appearance) at every size, the three statistics."""
    claims = []
    for size in dict.fromkeys(s for _, s in cells):
        recipes = [r for r, s in cells if s == size]
        for a, b in combinations(recipes, 2):
            claims += [Claim(a, b, stat, "any", size) for stat in vc.STATISTICS]
    return claims


def _expand(claims: list[Claim], cells: dict[tuple[str, str], Cell]) -> list[Verdict]:
    out = []
    sizes = list(dict.fromkeys(s for _, s in cells))
    for c in claims:
        found = [s for s in sizes if (c.a, s) in cells and (c.b, s) in cells]
        if c.size is not None:
            found = [s for s in found if s == c.size]
        if not found:
            where = f" at size {c.size}" if c.size is not None else ""
            missing = [r for r in (c.a, c.b) if not any(k[0] == r for k in cells)]
            why = f"not run: {', '.join(missing)}" if missing else f"not both run{where}"
            out.append(
                Verdict(
                    c.a, c.b, c.size or "-", c.statistic, c.expect, NOT_TESTED, c.name, note=why
                )
            )
        out += [Verdict(c.a, c.b, s, c.statistic, c.expect, st.INCONCLUSIVE, c.name) for s in found]
    return out


def _untestable(v: Verdict, ca: Cell, cb: Cell, plateau: float | None) -> str | None:
    if v.statistic == vc.RANGE and plateau is None:
        v.verdict = NOT_TESTED
        return "needs the plateau (--plateau)"
    if ca.n < 2 or cb.n < 2:
        return f"needs >= 2 seeds (has {ca.n} and {cb.n}): never a verdict from one seed"
    bad = [c for c in (ca, cb) if not c.usable]
    if bad:
        return "; ".join(f"{c.recipe}: {c.notes[-1]}" for c in bad)
    return None


def decide(
    cells: dict[tuple[str, str], Cell],
    claims: list[Claim] | None = None,
    plateau: float | None = None,
    loss_margin: float = vc.LOSS_MARGIN,
    alpha: float = st.ALPHA,
    plan: gs.Plan | None = None,
    stages: Stages | None = None,
    jobs: int = 1,
) -> list[Verdict]:
    """Every claim's verdict (claims None: the default family), Holm over the testable ones;
    `plan`: the study's plan of looks (SCIENCE.md 22.8), each claim at the look of its seeds;
    `stages`: where the command shows its progress (launch.progress); `jobs`: processes
    (launch.verdicts.workers: the same answers on any number)."""
    verdicts = _expand(claims if claims is not None else default_claims(cells), cells)
    tested: list[tuple[Verdict, Cell, Cell]] = []
    at: list[int] = []  # where each tested claim sits in `verdicts`
    for i, v in enumerate(verdicts):
        if v.verdict == NOT_TESTED:
            continue
        ca, cb = cells[(v.a, v.size)], cells[(v.b, v.size)]
        v.n_a, v.n_b = ca.n, cb.n
        why = _untestable(v, ca, cb, plateau)
        if why:
            v.note = why
            continue
        tested.append((v, ca, cb))
        at.append(i)
    if not tested:
        return verdicts
    shown = stages or Stages("verdicts", live=False, quiet=True)
    with shown.stage("testing claims", len(tested)) as tick:
        rows = fan_out(_p3_of, (tested, plateau, loss_margin), len(tested), tick, jobs)
    p3 = np.stack(rows)
    looks = None if plan is None else [gs.look_at(plan, ca.n, cb.n) for _, ca, cb in tested]
    codes, levels = vc.decide_family(p3, alpha, looks)
    with shown.stage("intervals, permutation p, seeds needed", len(tested)) as tick:
        job = (tested, codes, levels, p3, looks, plateau, loss_margin)
        for i, v in zip(at, fan_out(_decided, job, len(tested), tick, jobs), strict=True):
            verdicts[i] = v
    return verdicts


def _p3_of(job: tuple, i: int) -> np.ndarray:
    """The i-th tested claim's three one-sided p-values (fan_out's unit of the first stage)."""
    tested, plateau, loss_margin = job
    v, ca, cb = tested[i]
    return vc.claim_p3(v.statistic, ca.loss, cb.loss, plateau, loss_margin)


def _decided(job: tuple, i: int) -> Verdict:
    """The i-th tested claim decided at its Holm level, its numbers filled (the second stage)."""
    tested, codes, levels, p3, looks, plateau, loss_margin = job
    v, ca, cb = tested[i]
    v.verdict = st.OUTCOMES[int(codes[i])]  # before _fill: "needs k seeds" only when undecided
    _fill(v, ca, cb, plateau, loss_margin, float(levels[i]), p3[i])
    if looks is not None:
        v.rule = v.rule.replace("): ", f"; {looks[i].words()}): ", 1)
        more = looks[i].undecided() if v.verdict == st.INCONCLUSIVE else ""
        own = v.note if looks[i].fractions else ""  # past the plan: no seed count
        v.note = "; ".join(x for x in (own, looks[i].note, more) if x)
    return v


def _fill(
    v: Verdict,
    ca: Cell,
    cb: Cell,
    plateau: float | None,
    loss_margin: float,
    level: float,
    p3: np.ndarray,
) -> None:
    a, b = vc.per_seed(v.statistic, ca.loss, plateau), vc.per_seed(v.statistic, cb.loss, plateau)
    m = vc.margin_of(v.statistic, loss_margin)
    v.mean_a, v.mean_b, v.delta = float(a.mean()), float(b.mean()), float(a.mean() - b.mean())
    v.level, v.p, v.margin = level, float(p3.min()), m
    if v.statistic == vc.LOSS:  # the spread the test uses: sqrt(n var(mean)) per arm
        w = vc.loss_welch(ca.loss, cb.loss)
        var_a = len(a) * (vc.jackknife_var(ca.loss) if len(a) >= 3 else a.var(ddof=1) / len(a))
        var_b = len(b) * (vc.jackknife_var(cb.loss) if len(b) >= 3 else b.var(ddof=1) / len(b))
    else:
        w = st.welch(a, b)
        var_a, var_b = a.var(ddof=1), b.var(ddof=1)
    pooled_var = ((len(a) - 1) * var_a + (len(b) - 1) * var_b) / (len(a) + len(b) - 2)
    v.sd = float(math.sqrt(pooled_var))
    unit = "grid steps" if v.statistic == vc.RANGE else "nats"
    floor = st.permutation_floor(len(a), len(b))
    reachable = floor <= level + st.TOL
    if v.statistic == vc.RANGE:
        v.test = "exact permutation (Fisher-Pitman)"
        v.interval = (
            integer_interval(a, b, level)
            if not exact_in_reach(len(a), len(b)) and integer_valued(np.concatenate([a, b]))
            else st.permutation_interval(a, b, level)
        )
        v.p_permutation = v.p
        if not reachable:
            need = st.permutation_floor_n(level)
            n = f"{len(a)}" if len(a) == len(b) else f"{len(a)} and {len(b)}"
            v.note = f"verdict impossible at n = {n}: needs n >= {need} seeds per arm"
    else:
        jack = v.statistic == vc.LOSS and max(len(a), len(b)) >= 3
        v.test = "Welch t, jackknife SE" if jack else "Welch t"
        lo, hi = w.interval(level)
        v.interval = (float(lo), float(hi))
        if reachable and (v.statistic != vc.LOSS or ca.lrs == cb.lrs):
            _side_permutation(v, ca.loss, cb.loss, a, b, m)
    if not level > 0:  # past a plan's last look (group_sequential): no level, no seed count
        v.seeds_needed = None
    elif v.statistic == vc.LOSS:  # simulated: cross-fitting, the jackknife Welch, this level
        # an inconclusive claim needs more seeds than it has: past the calculator's range
        # (MAX_SIMULATED per arm) the answer is known without simulating
        past = v.verdict == st.INCONCLUSIVE and max(len(a), len(b)) >= MAX_SIMULATED
        v.seeds_needed = None if past else seeds_for_cells(ca, cb, v.delta, m, level)
    else:
        v.seeds_needed = st.seeds_needed(
            v.delta, v.sd, m, level, permutation=v.statistic == vc.RANGE
        )
    if v.verdict == st.INCONCLUSIVE and v.seeds_needed is not None:
        # the calculator's pooled-SD power (df 2n - 2) can name the seeds already run when the
        # arms' spreads differ (the test's Welch df is then near n - 1): never "needs" <= n
        v.seeds_needed = max(v.seeds_needed, max(len(a), len(b)) + 1)
    v.rule = (
        f"A-B in {unit}, (1-2a') interval at a'={level:.4g} (Holm, alpha {st.ALPHA:g}): "
        f"a_lower if hi < -{m:g}; b_lower if lo > {m:g}; equivalent if -{m:g} < lo and hi < {m:g} "
        "(TOST); else inconclusive"
    )
    if v.statistic == vc.LOSS:
        v.naive_a, v.naive_b = float(vc.naive_best(ca.loss)), float(vc.naive_best(cb.loss))
        v.best_lr_a = ca.lrs[int(np.argmin(ca.loss.mean(axis=0)))]
        v.best_lr_b = cb.lrs[int(np.argmin(cb.loss.mean(axis=0)))]
        v.pick_a = [int(i) for i in vc.cross_fitted(ca.loss)[1]]
        v.pick_b = [int(i) for i in vc.cross_fitted(cb.loss)[1]]
    if v.verdict == st.INCONCLUSIVE and not v.note:
        v.note = needs_next(v, ca.lrs, cb.lrs)


def needs_next(v: Verdict, lrs_a: tuple[float, ...], lrs_b: tuple[float, ...]) -> str:
    """What an inconclusive claim needs next: the seeds per arm for 80 % power at the observed
    difference and spread, and the seed-runs to add (each over its recipe's whole lr grid: the
    replication unit is a seed-run, and claim (a)'s selection needs every lr)."""
    how = " (simulated)" if v.statistic == vc.LOSS else ""
    if v.seeds_needed is None:
        most = v.seed_limit
        if v.statistic == vc.LOSS and max(v.n_a, v.n_b) >= most:  # already past the search
            return (
                f"undecided at {max(v.n_a, v.n_b)} seeds per arm, past the {most} the simulated "
                "calculator searches: adding seeds alone is unlikely to decide it"
            )
        return (
            f"more than {most} seeds per arm for 80% power{how} at the observed difference "
            "and spread: adding seeds alone is unlikely to decide it"
        )
    k = v.seeds_needed
    grid = (
        f"lr {_lrs(lrs_a)}"
        if lrs_a == lrs_b
        else f"lr {_lrs(lrs_a)} for {v.a}, {_lrs(lrs_b)} for {v.b}"
    )
    return (
        f"needs {k} seeds per arm for 80% power{how} at the observed difference and spread: "
        f"{k - v.n_a} more seed-runs of {v.a} and {k - v.n_b} of {v.b}, each at every {grid}"
    )


def _lrs(lrs: tuple[float, ...]) -> str:
    return ", ".join(f"{lr:g}" for lr in lrs)


def _side_permutation(
    v: Verdict, xa: np.ndarray, xb: np.ndarray, a: np.ndarray, b: np.ndarray, margin: float
) -> None:
    """The permutation p beside Welch: exact where every relabelling is enumerated; beyond,
    skipped where Welch decides the claim, else a sequential Monte-Carlo p with its MC SE."""
    if exact_in_reach(len(a), len(b)):
        v.p_permutation = _permutation_min_p(v.statistic, xa, xb, a, b, margin)
    elif v.verdict != st.INCONCLUSIVE:
        v.permutation_note = skipped_note(len(a), len(b))
    else:
        mc = mc_min_p(v.statistic, xa, xb, margin)
        v.p_permutation, v.p_permutation_se, v.permutation_note = mc.p, mc.se, mc.text()


def _permutation_min_p(
    statistic: str, xa: np.ndarray, xb: np.ndarray, a: np.ndarray, b: np.ndarray, margin: float
) -> float:
    """The exact permutation p of (a) or (b), reported next to Welch: for (a) the cross-fitted
    selection is redone in every relabelling of whole seed-runs."""
    if statistic != vc.LOSS:
        return float(vc.permutation_p3(a, b, margin).min())

    def stat(ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
        return vc.cross_fitted(ra)[0].mean(axis=-1) - vc.cross_fitted(rb)[0].mean(axis=-1)

    na = len(xa)
    rows = []
    for shift in (-margin, margin):
        pooled = np.concatenate([xa - shift, xb])
        dist = st.permutation_distribution(pooled, na, stat)
        rows.append((st.permutation_p(dist, True), st.permutation_p(dist, False)))
    (low_le, low_ge), (high_le, high_ge) = rows
    return float(min(low_le, high_ge, max(low_ge, high_le)))


def pilot_sd(cell: Cell, statistic: str, plateau: float | None = None) -> float:
    """The between-seed SD of a claim's per-seed statistic in a pilot cell (>= 2 seeds): for (a)
    sqrt(n var) with var the jackknife variance of the cross-fitted mean (the spread its test
    uses; var(y) / n at n = 2), else the sample SD of S(s) or W(s)."""
    if cell.n < 2:
        raise ConfigError(f"{cell.recipe}: a pilot spread needs >= 2 seeds, has {cell.n}")
    if statistic == vc.LOSS:
        y = vc.cross_fitted(cell.loss)[0]
        var = vc.jackknife_var(cell.loss) if cell.n >= 3 else y.var(ddof=1) / cell.n
        return float(math.sqrt(cell.n * var))
    return float(vc.per_seed(statistic, cell.loss, plateau).std(ddof=1))


def seeds_plan(
    statistic: str,
    sd: float,
    delta: float,
    family_size: int = 3,
    loss_margin: float = vc.LOSS_MARGIN,
    alpha: float = st.ALPHA,
    pilot: Cell | None = None,
) -> tuple[int | None, str]:
    """Seeds per arm to plan a claim before it runs: 80 % power for a true difference `delta` at
    between-seed SD `sd` (stated, or pilot_sd of a pilot study), at the smallest Holm level of a
    family of `family_size` claims, alpha / family_size (22.5). Claim (a) is simulated
    (launch.verdicts.power): on the pilot cell's curve and spread for both arms when one is
    given, else on a one-point grid at the stated SD (no lr selection to simulate)."""
    margin = vc.margin_of(statistic, loss_margin)
    level = alpha / family_size
    how = ""
    if statistic == vc.LOSS:
        if pilot is not None:
            n = seeds_for_cells(pilot, pilot, -delta, margin, level)
            how = ", simulated on the pilot's curve and spread"
        else:
            arm = ArmModel.stated(sd)
            n = seeds_for_models([(arm, arm)], -delta, margin, level)
            how = ", simulated without lr selection"
        most = MAX_SIMULATED
    else:
        n = st.seeds_needed(delta, sd, margin, level, permutation=statistic == vc.RANGE)
        most = st.MAX_SEEDS
    unit = "grid-step" if statistic == vc.RANGE else "nat"
    at = (
        f"at a {margin:g}-{unit} margin (SD {sd:.3g}, true difference {delta:g}, level "
        f"{level:.3g}{how})"
    )
    if n is None:
        return None, f"this claim cannot reach 80% power with <= {most} seeds per arm {at}"
    return n, f"this claim needs {n} seeds per arm {at}"
