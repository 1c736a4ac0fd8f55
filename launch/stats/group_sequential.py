"""Group-sequential looks (docs/SCIENCE.md 22.8): Lan-DeMets alpha spending, the boundaries of K
looks, and the nominal level a verdict at look k uses.

A study that reads its verdicts, adds seeds and reads them again has looked twice; each look at
the full level spends the whole alpha again. The standard remedy (Jennison & Turnbull 2000,
"Group Sequential Methods with Applications to Clinical Trials", ch. 2, 7 and 9) is a plan made
before the first look: K looks at information fractions t_1 < ... < t_K = 1 (t_k = n_k / n_K for
n_k seeds per arm) and a spending function alpha(t), alpha(0) = 0, alpha(1) = alpha, that says how
much of the one-sided level each look may use (Lan & DeMets 1983, Biometrika 70, 659-663):

    O'Brien-Fleming type   alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt t)
    Pocock type            alpha(t) = alpha ln(1 + (e - 1) t)

Under H0 the look statistics Z_k = S_k / sqrt(t_k), with S a Brownian motion in information
time, are jointly normal with corr(Z_i, Z_j) = sqrt(t_i / t_j) (i <= j). The boundary c_k solves

    P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1}),

computed here by the recursive numerical integration of Armitage, McPherson & Rowe (1969; Jennison
& Turnbull ch. 19): the sub-density of S_k on the continuation region, propagated through the
independent normal increments on a Simpson grid, and the crossing probability's root found with
brentq. tests/launch/stats/test_group_sequential.py checks it against scipy's multivariate
normal, the published constants (Jennison & Turnbull Tables 2.1 and 2.3; DeMets & Lan 1994) and
a simulated type I error.

A look's verdict compares its one-sided p with the nominal level Phi-bar(c_k) of its boundary (the
"significance level approach" of Jennison & Turnbull 3.8, which carries a z boundary over to a t
test on the look's own degrees of freedom), and its (1 - 2 alpha_k) interval is the repeated
confidence interval of ch. 9: the TOST/equivalence decision at look k is that interval inside the
margin. A look beyond the plan's last seed count has no alpha left (level 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from normlab.launch.errors import ConfigError
from scipy import optimize, special, stats

OBRIEN_FLEMING, POCOCK = "obrien_fleming", "pocock"
SPENDING = (OBRIEN_FLEMING, POCOCK)
NAMES = {OBRIEN_FLEMING: "O'Brien-Fleming-type", POCOCK: "Pocock-type"}
GRID = 401  # Simpson points per look (odd): boundaries to about 1e-9 (the tests check)
SQRT_2PI = math.sqrt(2.0 * math.pi)
TAIL = 10.0  # the grid's lower end, in standard deviations of S_k


def spent(spending: str, t: float, alpha: float) -> float:
    """alpha(t): the one-sided level spent by information fraction t (Lan & DeMets 1983)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == OBRIEN_FLEMING:
        return float(2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1.0 - alpha / 2.0) / math.sqrt(t)))
    if spending == POCOCK:
        return float(alpha * math.log(1.0 + (math.e - 1.0) * t))
    raise ValueError(f"spending {spending!r} is not one of {SPENDING}")


def _simpson(lo: float, hi: float, n: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (hi - lo) / (3.0 * (n - 1))


def _exit(x: np.ndarray, mass: np.ndarray, bound: float, sd: float, sides: int) -> float:
    """P(S_k crosses the boundary at look k, no earlier crossing): mass = weights x sub-density of
    S_{k-1} on its continuation grid x, sd the increment's standard deviation."""
    up = special.ndtr((x - bound) / sd)
    if sides == 2:
        up = up + special.ndtr((-bound - x) / sd)
    return float(mass @ up)


def _first(t: float, bound: float, sides: int) -> tuple[np.ndarray, np.ndarray]:
    """The grid and weighted density of S_1 ~ N(0, t) on its continuation region."""
    sd = math.sqrt(t)
    x, w = _simpson(-bound if sides == 2 else -TAIL * sd, bound)
    return x, w * stats.norm.pdf(x / sd) / sd


def _advance(
    x: np.ndarray, mass: np.ndarray, bound: float, t: float, sd: float, sides: int
) -> tuple[np.ndarray, np.ndarray]:
    """The grid and weighted sub-density of S_k on its continuation region (below `bound`, or
    inside +-bound)."""
    lo = -bound if sides == 2 else -TAIL * math.sqrt(t)
    y, w = _simpson(lo, bound)
    dens = np.exp(-0.5 * ((y[:, None] - x[None, :]) / sd) ** 2) @ mass / (sd * SQRT_2PI)
    return y, w * dens


def crossing_probabilities(z: np.ndarray, fractions: np.ndarray, sides: int = 1) -> np.ndarray:
    """Under H0, P(first crossing at look k) for z-scale boundaries z_k at fractions t_k (sides 1:
    Z_k >= z_k; 2: |Z_k| >= z_k)."""
    t = np.asarray(fractions, dtype=float)
    z = np.asarray(z, dtype=float)
    out = np.zeros(len(t))
    out[0] = sides * float(stats.norm.sf(z[0]))
    x, mass = _first(float(t[0]), float(z[0]) * math.sqrt(t[0]), sides)
    for k in range(1, len(t)):
        tk, b = float(t[k]), float(z[k]) * math.sqrt(t[k])
        sd = math.sqrt(tk - t[k - 1])
        out[k] = _exit(x, mass, b, sd, sides)
        x, mass = _advance(x, mass, b, tk, sd, sides)
    return out


def _excess(
    bound: float, x: np.ndarray, mass: np.ndarray, sd: float, sides: int, target: float
) -> float:
    return _exit(x, mass, bound, sd, sides) - target


@lru_cache(maxsize=4096)
def _boundaries(
    fractions: tuple[float, ...], alpha: float, spending: str, sides: int
) -> tuple[float, ...]:
    t = np.asarray(fractions)
    budget = alpha / sides  # per side
    z = np.empty(len(t))
    gain = spent(spending, float(t[0]), budget)
    z[0] = stats.norm.isf(gain) if gain > 0 else math.inf
    root = math.sqrt(t[0])
    x, mass = _first(float(t[0]), z[0] * root if math.isfinite(z[0]) else TAIL * root, sides)
    for k in range(1, len(t)):
        tk = float(t[k])
        gain = spent(spending, tk, budget) - spent(spending, float(t[k - 1]), budget)
        sd = math.sqrt(tk - t[k - 1])
        target = sides * gain
        hi = float(x.max()) + TAIL * sd
        if target <= 1e-15 or _exit(x, mass, hi, sd, sides) >= target:
            z[k], b = math.inf, hi
        else:
            lo = 0.0 if sides == 2 else float(x.min())
            b = optimize.brentq(_excess, lo, hi, args=(x, mass, sd, sides, target), xtol=1e-12)
            z[k] = b / math.sqrt(tk)
        x, mass = _advance(x, mass, b, tk, sd, sides)
    return tuple(float(v) for v in z)


def boundaries(
    fractions: list[float] | np.ndarray, alpha: float, spending: str, sides: int = 1
) -> np.ndarray:
    """z-scale boundaries c_1..c_K of a Lan-DeMets plan at information fractions t_k (increasing,
    in (0, 1]) and total level alpha (one-sided for sides 1, two-sided symmetric for 2)."""
    t = tuple(float(v) for v in fractions)
    if not t or any(b <= a for a, b in zip(t, t[1:], strict=False)) or t[0] <= 0 or t[-1] > 1:
        raise ValueError(f"information fractions must increase within (0, 1], got {t}")
    if spending not in SPENDING:
        raise ValueError(f"spending {spending!r} is not one of {SPENDING}")
    return np.array(_boundaries(t, float(alpha), spending, sides))


def classical_constant(looks: int, alpha: float, spending: str, sides: int = 2) -> float:
    """The constant of the classical designs with K equally spaced looks (Jennison & Turnbull
    2.3): Pocock c_k = C_P, O'Brien-Fleming c_k = C_B sqrt(K / k), total level alpha."""
    t = np.arange(1, looks + 1) / looks
    shape = np.ones(looks) if spending == POCOCK else np.sqrt(looks / np.arange(1, looks + 1))

    def excess(c: float) -> float:
        return float(crossing_probabilities(c * shape, t, sides).sum()) - alpha

    return float(optimize.brentq(excess, 1.0, 6.0, xtol=1e-10))


@dataclass(frozen=True)
class Plan:
    """A pre-registered plan of looks: the spending function and the seeds per arm at each look
    (the last is the most the study runs). `registered: false` records a plan written down after
    looks were taken (the honest record of a study continued without one)."""

    spending: str
    seeds: tuple[int, ...]
    registered: bool = True

    def describe(self) -> str:
        when = "pre-registered" if self.registered else "recorded after the looks"
        counts = ", ".join(map(str, self.seeds))
        return f"{NAMES[self.spending]} spending over looks at n = {counts}, {when}"


@dataclass(frozen=True)
class Look:
    """Where a verdict's data sits in its plan: the information fractions of the looks up to and
    including this one, the plan, and what is unusual about it (empty: a planned look)."""

    plan: Plan
    n: float
    fractions: tuple[float, ...]
    note: str = ""

    @property
    def index(self) -> int:
        return len(self.fractions)

    @property
    def final(self) -> bool:
        """At (or past) the plan's last look: more seeds get no alpha under this plan."""
        return not self.fractions or self.fractions[-1] >= 1.0 - 1e-12

    def undecided(self) -> str:
        """What an inconclusive verdict at this look may do next."""
        if self.final:
            return "the plan's last look: more seeds need a new study with its own plan"
        nxt = next(s for s in self.plan.seeds if s > self.n + 1e-9)
        return f"the plan's next look is at n {nxt}"

    def words(self) -> str:
        """One phrase for a verdict's rule: "look 2 of 2 at n 8, Pocock-type spending over ..."."""
        n = f"n {self.n:g}"
        where = f"look {self.index} of {len(self.plan.seeds)} at {n}" if self.fractions else n
        return f"{where}, {self.plan.describe()}"


def look_at(plan: Plan, n_a: float, n_b: float | None = None) -> Look:
    """The look a verdict on n_a (and n_b) seeds per arm is at: its information is the harmonic
    mean 2 / (1/n_a + 1/n_b) seeds per arm. A count the plan names is that look; one between two
    planned counts is an unplanned look inserted there (Lan-DeMets allows it; the verdict says
    so); one beyond the last count has no alpha left."""
    n = float(n_a) if n_b is None or n_a == n_b else 2.0 / (1.0 / n_a + 1.0 / n_b)
    last = plan.seeds[-1]
    if n > last + 1e-9:
        note = (
            f"n {n:g} is past the plan's last look (n {last}): no alpha is left, so no verdict; "
            "decide at the planned seeds or pre-register a new plan"
        )
        return Look(plan, n, (), note)
    before = [s / last for s in plan.seeds if s < n - 1e-9]
    note = ""
    if not any(abs(s - n) < 1e-9 for s in plan.seeds):
        counts = ", ".join(map(str, plan.seeds))
        note = f"n {n:g} is not a planned look (n = {counts}): its boundary is inserted there"
    if not plan.registered:
        note = "; ".join(x for x in (note, "study continued without a pre-registered plan") if x)
    return Look(plan, n, (*before, n / last), note)


def nominal_level(alpha: float, look: Look | None) -> float:
    """The one-sided nominal level of a verdict at `look` whose plan spends `alpha` (a claim's
    Holm level): Phi-bar(c_k). No plan: alpha itself; past the plan: 0."""
    if look is None:
        return alpha
    if not look.fractions:
        return 0.0
    z = boundaries(list(look.fractions), alpha, look.plan.spending)[-1]
    return float(stats.norm.sf(z))


def sequential_p(p: float, look: Look | None, alpha: float) -> float:
    """The smallest plan level alpha* at which a one-sided p at `look` rejects (nominal_level(
    alpha*, look) = p), for Holm's ordering across claims at different looks; above alpha it is
    only ordered (1 + p), since no step of Holm at alpha can reject it."""
    if look is None or not math.isfinite(p):
        return p
    if not look.fractions or nominal_level(alpha, look) < p:
        return 1.0 + p
    if p <= 0:
        return 0.0
    return float(
        optimize.brentq(lambda a: nominal_level(a, look) - p, p, alpha, xtol=1e-14, rtol=1e-12)
    )


def plan_from_data(value: object, where: str = "") -> Plan:
    """A study file's `looks:` {spending, seeds, registered?} as a Plan; anything else is one
    ConfigError line naming the key."""
    keys = ("spending", "seeds", "registered")
    if not isinstance(value, dict):
        raise ConfigError(f"{where}'looks' must be a mapping with keys {', '.join(keys)}")
    unknown = sorted(str(k) for k in set(value) - set(keys))
    if unknown:
        raise ConfigError(f"{where}unknown key 'looks.{unknown[0]}'; allowed: {', '.join(keys)}")
    spending = value.get("spending")
    if spending not in SPENDING:
        raise ConfigError(
            f"{where}looks.spending must be one of {', '.join(SPENDING)}, got {spending!r}"
        )
    seeds = value.get("seeds")
    ok = (
        isinstance(seeds, list)
        and len(seeds) >= 2
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 2 for s in seeds)
        and all(b > a for a, b in zip(seeds, seeds[1:], strict=False))
    )
    if not ok:
        raise ConfigError(
            f"{where}looks.seeds must be >= 2 increasing seed counts per arm, each >= 2, "
            f"got {seeds!r}"
        )
    registered = value.get("registered", True)
    if not isinstance(registered, bool):
        raise ConfigError(f"{where}looks.registered must be true or false, got {registered!r}")
    assert isinstance(seeds, list)  # checked by `ok`
    return Plan(str(spending), tuple(int(s) for s in seeds), registered)
