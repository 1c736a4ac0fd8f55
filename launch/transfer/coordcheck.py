"""The coordinate check (SCIENCE.md 21.5): is a parametrization implemented right?

For each width (or depth) and seed, a few AdamW steps on one fixed batch, recording per layer
class the mean |x| per coordinate of that class's outputs at steps t = 1..k (t = 1: the forward
at initialisation) and its change since t = 1, mean |x_t - x_1| (per block, then averaged).

Each check (class, quantity, step) has a known exponent e: how log2 of the quantity grows per
doubling of the size under a correct parametrization. Per seed s the least-squares slope b_s of
log2 quantity on log2 size; over the seeds a 95 % t interval of the mean slope, against the band
e ± BAND (BAND = 0.25, half the smallest exponent mistake the check must catch, 0.5 per doubling;
the derivation is docs/SCIENCE.md 21.5):
- pass: the interval inside the band; fail: the interval wholly outside it; else inconclusive.
- finite width: a check whose fit over all sizes does not pass, but whose pairwise slopes (per
  adjacent pair) shrink toward e and whose fit over the wider sizes passes, passes "from width W"
  and says so; a wrong exponent does not shrink.

Width checks: the level at t = 1 (init: embed, attn, mlp, last_layer e = 0; logits e = -1/2,
under µP the head input carries 1/m_N and the head's init std is width-free, so the logits are
sqrt(d) / m_N) and the change at t = k (training: every class e = 0). Depth checks: the last
block's output at t = 1 and its change at t = k, e = 0 (what that can and cannot tell apart:
docs/transfer.md).

Negative controls run beside the recipe (`CONTROLS`): each is a deliberate mistake that the check
must fail; one that does not fail makes the verdict inconclusive ("lacks power"), so a pass
carries its own power.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from normlab.launch.config import OptimSection
from normlab.launch.optim import build_optimizer
from normlab.model import ModelConfig, Transformer, lm_loss
from normlab.model.parametrization import depth_alpha, width_mult

BAND = 0.25  # half the smallest exponent mistake, 0.5 per doubling (docs/SCIENCE.md 21.5)
LEVEL_95 = 0.975  # two-sided 95 % t interval: each one-sided error at most 2.5 %
WIDTH_CLASSES = ("embed", "attn", "mlp", "last_layer", "logits", "head_update")
DEPTH_CLASSES = ("blocks", "last_layer")
LOGITS_INIT_EXPONENT = -0.5  # µP: logits at t = 1 ∝ sqrt(d) / m_N
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
EXIT = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


@dataclass
class CoordSetup:
    """What one check sweeps: `axis` 'width' (d_model, d_head fixed) or 'depth' (n_layers)."""

    axis: str
    sizes: tuple[int, ...]
    steps: int = 4
    seeds: int = 6
    lr: float = 1e-3  # AdamW lr (the command: the recipe's optim.lr)
    batch: int = 4
    seq_len: int = 32
    first_seed: int = 0  # the check's own seed: seeds first_seed .. first_seed + seeds - 1

    def __post_init__(self) -> None:
        if self.axis not in ("width", "depth"):
            raise ValueError(f"the axis must be width or depth, got {self.axis!r}")
        if len(self.sizes) < 2 or len(set(self.sizes)) != len(self.sizes):
            raise ValueError(f"--{self.axis}s needs at least 2 distinct sizes, got {self.sizes}")
        if min(self.sizes) < 1:
            raise ValueError(f"--{self.axis}s must be >= 1, got {self.sizes}")
        if self.steps < 2:
            raise ValueError(f"--steps must be >= 2 (t = k is checked), got {self.steps}")
        if self.seeds < 2:
            raise ValueError(f"--seeds must be >= 2 (an interval needs two), got {self.seeds}")
        self.sizes = tuple(sorted(self.sizes))


@dataclass(frozen=True)
class Check:
    """One decided slope: `quantity` 'level' (mean |x_t|) or 'change' (mean |x_t - x_1|)."""

    klass: str
    quantity: str
    t: int
    exponent: float

    @property
    def name(self) -> str:
        return f"{self.klass} {self.quantity} at t={self.t}"


def depth_exponent(cfg: ModelConfig) -> float:
    """The blocks' sum x_L - x_0 at init: L independent zero-mean branches, each m_L^-α, add up
    to sqrt(L) · L^-α, so 1/2 - α per doubling of the depth (α = 0 without a depth rule)."""
    return 0.5 - (depth_alpha(cfg) if cfg.parametrization == "completep" else 0.0)


def checks_for(setup: CoordSetup, cfg: ModelConfig) -> list[Check]:
    """The checks of the module docstring."""
    k = setup.steps
    if setup.axis == "depth":
        return [Check("blocks", "level", 1, depth_exponent(cfg))]
    at_init = ("embed", "attn", "mlp", "last_layer", "logits")
    init = [Check(c, "level", 1, LOGITS_INIT_EXPONENT if c == "logits" else 0.0) for c in at_init]
    trained = [Check(c, "change", k, 0.0) for c in ("embed", "attn", "mlp", "last_layer")]
    return init + trained + [Check("head_update", "level", k, 0.0)]


@dataclass
class Interval:
    mean: float
    lo: float
    hi: float
    n: int

    def as_json(self) -> dict:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}


@dataclass
class CheckResult:
    check: Check
    fit: Interval  # over all sizes
    pairwise: list[Interval]  # per adjacent pair of sizes
    outcome: str
    reason: str  # one line
    from_size: int | None = None  # finite width: the size from which the slope is judged

    def as_json(self) -> dict:
        c = self.check
        return {
            "class": c.klass,
            "quantity": c.quantity,
            "t": c.t,
            "exponent": c.exponent,
            "fit": self.fit.as_json(),
            "pairwise": [p.as_json() for p in self.pairwise],
            "outcome": self.outcome,
            "reason": self.reason,
            "from_size": self.from_size,
        }


@dataclass
class CoordResult:
    """level/change[class][t-1][size index] (mean over seeds), the loss per step, the checks."""

    setup: CoordSetup
    classes: tuple[str, ...]
    level: dict[str, list[list[float]]] = field(default_factory=dict)
    change: dict[str, list[list[float]]] = field(default_factory=dict)
    loss: list[list[float]] = field(default_factory=list)  # [t-1][size index], mean over seeds
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        outcomes = {r.outcome for r in self.checks}
        return FAIL if FAIL in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else PASS

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    def reason(self) -> str:
        """One line: the first failed check, else the first inconclusive one, else the pass."""
        for outcome in (FAIL, INCONCLUSIVE):
            bad = [r for r in self.checks if r.outcome == outcome]
            if bad:
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                return f"{bad[0].reason}{more}"
        finite = [r for r in self.checks if r.from_size is not None]
        note = f"; finite width: {len(finite)} judged from wider sizes" if finite else ""
        return f"all {len(self.checks)} slopes inside their band{note}"


# ---------------------------------------------------------------------------------------------
# negative controls: deliberate mistakes the check must catch (product features, kept small)


@dataclass(frozen=True)
class Control:
    """A deliberate mistake: `model` turns the checked model config into the mistaken one,
    `optimizer` edits the built optimizer's groups in place."""

    name: str
    what: str
    model: Callable[[ModelConfig], ModelConfig] = lambda cfg: cfg
    optimizer: Callable[[torch.optim.Optimizer, ModelConfig], None] = lambda opt, cfg: None


def as_sp(cfg: ModelConfig) -> ModelConfig:
    """The same model under the standard parametrization (same init scheme)."""
    return replace(
        cfg,
        parametrization="sp",
        base_d_model=None,
        base_n_layers=None,
        completep_alpha=None,
        input_mult=None,
        output_mult=None,
        attn_mult=None,
    )


def unscale_hidden_lr(opt: torch.optim.Optimizer, cfg: ModelConfig) -> None:
    """Undo the hidden matrices' lr factor m_N^-1 (µP's Adam rule) on a built optimizer."""
    for group in opt.param_groups:
        if str(group.get("group", "")).endswith("/hidden"):
            group["lr"] *= width_mult(cfg)
            group["lr_mult"] = group.get("lr_mult", 1.0) * width_mult(cfg)


def other_alpha(cfg: ModelConfig) -> ModelConfig:
    """CompleteP with the other α of the paper's Table 1 (1 <-> 0.5)."""
    return replace(cfg, completep_alpha=0.5 if depth_alpha(cfg) == 1.0 else 1.0)


CONTROLS = {
    "width": (
        Control("sp", "standard parametrization (no width rule)", model=as_sp),
        Control(
            "hidden_lr_unscaled",
            "the recipe with the hidden matrices' lr not divided by m_N",
            optimizer=unscale_hidden_lr,
        ),
    ),
    "depth": (
        Control("sp", "standard parametrization (no depth rule)", model=as_sp),
        Control("other_alpha", "CompleteP with the other α (1 <-> 0.5)", model=other_alpha),
    ),
}
CONTROL_SEEDS = 3  # a control is a mistake of >= 0.5: 3 seeds catch it (fewer than the check's)


# ---------------------------------------------------------------------------------------------
# measurement


def scaled_config(base: ModelConfig, axis: str, size: int) -> ModelConfig:
    """The recipe's model at another width (heads added at a fixed d_head, d_ff in proportion)
    or depth."""
    values = base.to_dict()
    if axis == "depth":
        return ModelConfig(**(values | {"n_layers": size}))
    if size % base.head_dim:
        raise ValueError(f"width {size} is not a multiple of d_head {base.head_dim}")
    heads = size // base.head_dim
    kv = max(1, heads * (base.n_kv_heads or base.n_heads) // base.n_heads)
    d_ff = max(1, round(base.d_ff * size / base.d_model))
    return ModelConfig(
        **(values | {"d_model": size, "n_heads": heads, "n_kv_heads": kv, "d_ff": d_ff})
    )


def _hooks(model: Transformer, record: Callable[[str, torch.Tensor], None]) -> list:
    last = model.blocks[-1]
    taps: list[tuple[Any, str]] = [(model.embed_mult, "embed"), (last, "last_layer")]
    taps.append((model.head, "logits"))
    for block in model.blocks:
        taps += [(block.attn.branch, "attn"), (block.mlp.branch, "mlp")]  # type: ignore[union-attr]
    handles = [m.register_forward_hook(lambda _m, _i, out, k=k: record(k, out)) for m, k in taps]
    # "head_update": (W_t - W_1) h_t, the logits' change that the head's own update makes
    w1 = model.head.weight.detach().clone()

    def head_update(m: Any, inputs: tuple, _out: Any) -> None:
        record("head_update", torch.nn.functional.linear(inputs[0], m.weight - w1))

    handles.append(model.head.register_forward_hook(head_update))
    # "blocks": x_L - x_0, what the blocks add to the stream they are given
    stream: list[torch.Tensor] = []

    def keep_input(_m: Any, inputs: tuple) -> None:
        stream[:] = [inputs[0]]

    def blocks_sum(_m: Any, _i: Any, out: torch.Tensor) -> None:
        record("blocks", out - stream[0])

    handles.append(model.blocks[0].register_forward_pre_hook(keep_input))
    handles.append(last.register_forward_hook(blocks_sum))
    return handles


def measure_one(
    cfg: ModelConfig,
    setup: CoordSetup,
    optim: OptimSection,
    seed: int,
    control: Control | None = None,
) -> dict:
    """{'level': {class: [t = 1..k]}, 'change': {...}, 'loss': [...]} for one model and seed, on
    one fixed batch (mup's fix_data)."""
    if control is not None:
        cfg = control.model(cfg)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    opt = build_optimizer(model, replace(optim, lr=setup.lr))
    if control is not None:
        control.optimizer(opt, cfg)
    gen = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.randint(0, cfg.vocab_size, (setup.batch, setup.seq_len + 1), generator=gen)
    first: dict[str, list[torch.Tensor]] = {}
    level: dict[str, list[float]] = {}
    change: dict[str, list[float]] = {}

    def record(klass: str, out: torch.Tensor) -> None:
        x = out.detach().float()
        level.setdefault(klass, []).append(x.abs().mean().item())
        seen = change.setdefault(klass, [])
        ref = first.setdefault(klass, [])
        if len(ref) <= len(seen):  # t = 1: keep every block's output
            ref.append(x.clone())
        seen.append((x - ref[len(seen)]).abs().mean().item())

    handles = _hooks(model, record)
    rows: list[dict[str, dict[str, float]]] = []
    losses: list[float] = []
    try:
        for _ in range(setup.steps):
            level.clear()
            change.clear()
            loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
            losses.append(loss.item())
            rows.append(
                {
                    "level": {k: statistics.fmean(v) for k, v in level.items()},
                    "change": {k: statistics.fmean(v) for k, v in change.items()},
                }
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        for h in handles:
            h.remove()
    out: dict = {q: {k: [row[q][k] for row in rows] for k in rows[0][q]} for q in rows[0]}
    return out | {"loss": losses}


# ---------------------------------------------------------------------------------------------
# statistics


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log2(y) on log2(x)."""
    lx = [math.log2(x) for x in xs]
    ly = [math.log2(max(y, 1e-30)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return num / sum((a - mx) ** 2 for a in lx)


def t_interval(values: Sequence[float]) -> Interval:
    """The 95 % t interval of the mean (n - 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    n = len(values)
    mean = statistics.fmean(values)
    half = float(student_t.ppf(LEVEL_95, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def against_band(iv: Interval, exponent: float) -> str:
    """pass: the interval inside exponent ± BAND; fail: wholly outside; else inconclusive."""
    lo, hi = exponent - BAND, exponent + BAND
    if lo <= iv.lo and iv.hi <= hi:
        return PASS
    if iv.hi < lo or iv.lo > hi:
        return FAIL
    return INCONCLUSIVE


def _fmt(iv: Interval) -> str:
    return f"{iv.mean:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}]"


def decide(check: Check, sizes: Sequence[int], per_seed: Sequence[Sequence[float]]) -> CheckResult:
    """One check from per_seed[seed][size index] (the quantity of each seed at each size)."""
    e = check.exponent
    fit = t_interval([slope(sizes, ys) for ys in per_seed])
    pairs = [
        t_interval([slope(sizes[i : i + 2], ys[i : i + 2]) for ys in per_seed])
        for i in range(len(sizes) - 1)
    ]
    band = f"band {e:+.2f} ± {BAND}"
    where = f"{check.name}: slope {_fmt(fit)} per doubling"
    outcome = against_band(fit, e)
    if outcome == PASS:
        return CheckResult(check, fit, pairs, PASS, f"{where}, inside {band}")
    # finite width: the pairwise slopes' distance to e shrinks with size, and the fit over the
    # wider sizes passes
    dist = [abs(p.mean - e) for p in pairs]
    for j in range(1, len(sizes) - 1):
        shrinking = all(dist[i] >= dist[i + 1] for i in range(j))
        tail = t_interval([slope(sizes[j:], ys[j:]) for ys in per_seed])
        if shrinking and against_band(tail, e) == PASS:
            steps = ", ".join(f"{p.mean:+.2f}" for p in pairs)
            return CheckResult(
                check,
                fit,
                pairs,
                PASS,
                f"{where}; finite width: pairwise slopes {steps} shrink toward {e:+.2f}, "
                f"from width {sizes[j]} {_fmt(tail)}, inside {band}",
                from_size=sizes[j],
            )
    widest = pairs[-1]
    if outcome == FAIL and against_band(widest, e) == FAIL:
        return CheckResult(check, fit, pairs, FAIL, f"{where}, outside {band}")
    need = "add seeds" if fit.hi - fit.lo > 2 * BAND else "add seeds or wider sizes"
    return CheckResult(
        check,
        fit,
        pairs,
        INCONCLUSIVE,
        f"{where} against {band}, widest pair {_fmt(widest)}: inconclusive, {need}",
    )


def coord_check(
    base: ModelConfig,
    setup: CoordSetup,
    optim: OptimSection | None = None,
    control: Control | None = None,
    progress: Callable[[str], None] | None = None,
) -> CoordResult:
    """Run the sweep (one configuration: the recipe, or one of its controls) and decide."""
    optim = optim or OptimSection(grad_clip=0.0)
    classes = WIDTH_CLASSES if setup.axis == "width" else DEPTH_CLASSES
    runs: dict[int, list[dict]] = {}
    seeds, k = range(setup.seeds), setup.steps
    for size in setup.sizes:
        cfg = scaled_config(base, setup.axis, size)
        runs[size] = [measure_one(cfg, setup, optim, setup.first_seed + s, control) for s in seeds]
        if progress is not None:
            progress(f"{setup.axis} {size} done")
    res = CoordResult(setup, classes)
    for q, store in (("level", res.level), ("change", res.change)):
        for klass in classes:
            store[klass] = [
                [statistics.fmean(runs[n][s][q][klass][t] for s in seeds) for n in setup.sizes]
                for t in range(k)
            ]
    res.loss = [
        [statistics.fmean(runs[n][s]["loss"][t] for s in seeds) for n in setup.sizes]
        for t in range(k)
    ]
    for check in checks_for(setup, base):  # a control is judged by the recipe's exponents
        per_seed = [
            [runs[n][s][check.quantity][check.klass][check.t - 1] for n in setup.sizes]
            for s in seeds
        ]
        res.checks.append(decide(check, setup.sizes, per_seed))
    return res


@dataclass
class Verdict:
    """The recipe's check and its controls: the outcome, its exit code, the reason line."""

    result: CoordResult
    controls: dict[str, CoordResult]

    @property
    def uncaught(self) -> list[str]:
        return [name for name, r in self.controls.items() if r.outcome != FAIL]

    @property
    def outcome(self) -> str:
        if self.result.outcome == PASS and self.uncaught:
            return INCONCLUSIVE
        return self.result.outcome

    @property
    def exit_code(self) -> int:
        return EXIT[self.outcome]

    def reason(self) -> str:
        if self.result.outcome == PASS and self.uncaught:
            names = ", ".join(self.uncaught)
            return f"lacks power: control {names} not caught at this setup: add seeds or sizes"
        line = self.result.reason()
        if self.result.outcome == PASS and self.controls:
            line += f"; controls caught: {', '.join(self.controls)}"
        return line


def run_check(
    base: ModelConfig,
    setup: CoordSetup,
    optim: OptimSection | None = None,
    controls: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Verdict:
    """The recipe's check and, unless `controls` is False, each control of its axis."""

    def stage(name: str) -> Callable[[str], None] | None:
        return None if progress is None else (lambda what: progress(f"{name}: {what}"))

    if setup.axis == "depth" and base.parametrization != "completep":
        raise ValueError(
            "the depth check checks CompleteP's depth rule (model.parametrization completep); "
            f"{base.parametrization} has none"
        )
    result = coord_check(base, setup, optim, progress=stage(base.parametrization))
    found = {}
    small = replace(setup, seeds=min(setup.seeds, CONTROL_SEEDS))
    for c in CONTROLS[setup.axis] if controls else ():
        found[c.name] = coord_check(base, small, optim, c, progress=stage(f"control {c.name}"))
    return Verdict(result, found)


def as_json(res: CoordResult) -> dict:
    s = res.setup
    return {
        "axis": s.axis,
        "sizes": list(s.sizes),
        "steps": s.steps,
        "seeds": s.seeds,
        "lr": s.lr,
        "batch": s.batch,
        "seq_len": s.seq_len,
        "first_seed": s.first_seed,
        "rule": f"per-seed slopes of log2 quantity on log2 {s.axis}, 95 % t interval against "
        f"the exponent ± {BAND}: pass inside, fail outside, else inconclusive "
        "(docs/SCIENCE.md 21.5)",
        "checks": [c.as_json() for c in res.checks],
        "classes": {
            k: {
                "level": res.level[k],
                "change": res.change[k],
                "level_slope": [slope(s.sizes, row) for row in res.level[k]],
                "change_slope": [slope(s.sizes, row) for row in res.change[k][1:]],
            }
            for k in res.classes
        },
        "loss": res.loss,
        "outcome": res.outcome,
        "reason": res.reason(),
    }


def verdict_json(v: Verdict) -> dict:
    return as_json(v.result) | {
        "verdict": v.outcome,
        "verdict_reason": v.reason(),
        "controls": {
            name: {
                "what": next(c.what for c in CONTROLS[v.result.setup.axis] if c.name == name),
                "seeds": r.setup.seeds,
                "outcome": r.outcome,
                "caught": r.outcome == FAIL,
                "reason": r.reason(),
                "checks": [c.as_json() for c in r.checks],
            }
            for name, r in v.controls.items()
        },
    }
