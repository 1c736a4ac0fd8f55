"""The coordinate check (SCIENCE.md 21.5): is a parametrization implemented right?

For each width (or depth) and seed, a few AdamW steps on one fixed batch, recording per layer
class the mean |x| per coordinate of that class's outputs at steps t = 1..k (t = 1: the forward at
initialisation). The statistic per (class, t) is the least-squares slope of log2(mean over seeds)
on log2(width) (or log2(depth)). Pass: |slope| <= 0.15 for every class at the checked steps (the
mup package's own test allows 1.2x over 4x, slope 0.132):
- width: t = 2 and t = k; the logits at t = k only: their init part shrinks like m_N^-1/2 under
  µP (the output transient of the mup README, exempt at t = 1 by 21.5) and is still half of them
  one step later at σ 0.02 [choice: measured, a µP run failing only there is this transient];
- depth: t = k (21.5 names no step for depth) [choice]; every slope is in the JSON.

Classes: `embed` (embedding output, after α_in), `attn` and `mlp` (branch outputs, averaged over
blocks), `last_layer` (the final block's output), `logits` (the head's output). The depth check
reads `last_layer` and `last_layer_delta` = mean |x_t - x_1| of the final block (21.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from normlab.launch.config import OptimSection
from normlab.launch.optim import build_optimizer
from normlab.model import ModelConfig, Transformer, lm_loss

SLOPE_LIMIT = 0.15  # SCIENCE.md 21.5
WIDTH_CLASSES = ("embed", "attn", "mlp", "last_layer", "logits")
DEPTH_CLASSES = ("last_layer", "last_layer_delta")


@dataclass
class CoordSetup:
    """What one check sweeps: `axis` 'width' (d_model, d_head fixed) or 'depth' (n_layers)."""

    axis: str
    sizes: tuple[int, ...]
    steps: int = 10
    seeds: int = 3
    lr: float = 1e-2  # AdamW lr: SCIENCE.md 21.5 takes 10x the base model's best lr
    batch: int = 4
    seq_len: int = 32

    def __post_init__(self) -> None:
        if self.axis not in ("width", "depth"):
            raise ValueError(f"the axis must be width or depth, got {self.axis!r}")
        if len(self.sizes) < 2 or len(set(self.sizes)) != len(self.sizes):
            raise ValueError(f"--{self.axis}s needs at least 2 distinct sizes, got {self.sizes}")
        if min(self.sizes) < 1:
            raise ValueError(f"--{self.axis}s must be >= 1, got {self.sizes}")
        if self.steps < 2:
            raise ValueError(f"--steps must be >= 2 (t = 2 is checked), got {self.steps}")
        if self.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {self.seeds}")


@dataclass
class CoordResult:
    """l1[class][t-1][size index] (mean over seeds), slope[class][t-1], and the verdict."""

    setup: CoordSetup
    classes: tuple[str, ...]
    l1: dict[str, list[list[float]]] = field(default_factory=dict)
    slope: dict[str, list[float]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # "class at t=k: slope s"

    @property
    def passed(self) -> bool:
        return not self.failed


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
    return [m.register_forward_hook(lambda _m, _i, out, k=k: record(k, out)) for m, k in taps]


def measure_one(cfg: ModelConfig, setup: CoordSetup, optim: OptimSection, seed: int) -> dict:
    """{class: [l1 at t = 1..k]} for one model and seed, on one fixed batch (fix_data)."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    opt = build_optimizer(model, replace(optim, lr=setup.lr))
    gen = torch.Generator().manual_seed(10_000 + seed)
    tokens = torch.randint(0, cfg.vocab_size, (setup.batch, setup.seq_len + 1), generator=gen)
    sums: dict[str, list[float]] = {}
    first: list[torch.Tensor] = []

    def record(klass: str, out: torch.Tensor) -> None:
        x = out.detach().float()
        sums.setdefault(klass, []).append(x.abs().mean().item())
        if klass == "last_layer":
            if not first:
                first.append(x.clone())
            sums.setdefault("last_layer_delta", []).append((x - first[0]).abs().mean().item())

    handles = _hooks(model, record)
    per_step: list[dict[str, float]] = []
    try:
        for _ in range(setup.steps):
            sums.clear()
            loss, _ = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
            per_step.append({k: sum(v) / len(v) for k, v in sums.items()})  # mean over blocks
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        for h in handles:
            h.remove()
    return {k: [row[k] for row in per_step] for k in per_step[0]}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log2(y) on log2(x)."""
    lx = [math.log2(x) for x in xs]
    ly = [math.log2(max(y, 1e-30)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return num / sum((a - mx) ** 2 for a in lx)


def coord_check(
    base: ModelConfig, setup: CoordSetup, optim: OptimSection | None = None
) -> CoordResult:
    """Run the sweep and decide the pass rule of SCIENCE.md 21.5."""
    optim = optim or OptimSection(grad_clip=0.0)
    classes = WIDTH_CLASSES if setup.axis == "width" else DEPTH_CLASSES
    runs = {
        size: [
            measure_one(scaled_config(base, setup.axis, size), setup, optim, s)
            for s in range(setup.seeds)
        ]
        for size in setup.sizes
    }
    res = CoordResult(setup, classes)
    for klass in classes:
        res.l1[klass] = [
            [sum(r[klass][t] for r in runs[size]) / setup.seeds for size in setup.sizes]
            for t in range(setup.steps)
        ]
        res.slope[klass] = [slope(setup.sizes, row) for row in res.l1[klass]]
        for t in checked_steps(setup, klass):
            s = res.slope[klass][t - 1]
            if abs(s) > SLOPE_LIMIT:
                res.failed.append(f"{klass} at t={t}: slope {s:+.3f}")
    return res


def checked_steps(setup: CoordSetup, klass: str) -> list[int]:
    """The steps whose slope decides the verdict (see the module docstring)."""
    if setup.axis == "depth" or klass == "logits":
        return [setup.steps]
    return sorted({2, setup.steps})


def as_json(res: CoordResult) -> dict:
    s = res.setup
    return {
        "axis": s.axis,
        "sizes": list(s.sizes),
        "steps": s.steps,
        "seeds": s.seeds,
        "lr": s.lr,
        "rule": f"|slope of log2 mean|x| on log2 {s.axis}| <= {SLOPE_LIMIT} for every class "
        "at its checked steps (SCIENCE.md 21.5; logits and depth: t = k only)",
        "checked_steps": {k: checked_steps(s, k) for k in res.classes},
        "classes": {k: {"l1": res.l1[k], "slope": res.slope[k]} for k in res.classes},
        "passed": res.passed,
        "failed": res.failed,
    }
