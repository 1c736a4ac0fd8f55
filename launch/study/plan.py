"""The runs a study trains: a StudySpec (a file or the flags) expanded into validated configs.

Run directories are DIR/runs/<recipe>_<grid point>_s<seed> (`pre_lr0.001_n_layers12_s0`);
DIR/plan.json lists every run before training starts (`normlab status DIR` reads it).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.launch.config import RunConfig, load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.errors import ConfigError
from normlab.launch.study.spec import LR, StudyRecipe, StudySpec, check_spec

DEFAULT_RECIPES = [
    "post_warmup",
    "post_nowarmup",
    "pre",
    "pre_nowarmup",
    "deepnorm",
    "peri",
    "ln_scaling",
]
DEFAULT_LRS = (1e-3, 3e-3)
DEFAULT_SEEDS = (0, 1)
OBSERVERS = ["activations", "gradients", "attention_logits", "qk_gains", "init_loss"]
OBSERVERS += ["output_logits"]
PLAN = "plan.json"


@dataclass
class Planned:
    """One run of a study: its config and where it sits in the grid."""

    cfg: RunConfig
    recipe: str  # the recipe entry's label
    size: str  # 'n_layers=12', or '-' without a size axis
    lr: float
    seed: int


def spike_window(steps: int, asked: int | None) -> int:
    """OLMo 2's 1000-value window, shortened for short studies so points get scored."""
    return asked if asked is not None else min(1000, max(10, steps // 5))


def _short(key: str, value: Any) -> str:
    tail = key.rsplit(".", 1)[-1]
    return f"lr{value:g}" if key == LR else f"{tail}{value}".replace("/", "-")


def run_label(recipe: str, lr: float | None, seed: int | None) -> str:
    """Run directory name: the recipe alone, or with its learning rate and seed."""
    return run_dir_name(recipe, {LR: lr} if lr is not None else {}, seed)


def run_dir_name(recipe: str, point: dict[str, Any], seed: int | None) -> str:
    """Run directory name: the recipe, its grid point in short form and the seed (claims.point_label
    is the human-readable text of a grid point)."""
    label = "_".join([recipe, *(_short(k, v) for k, v in point.items())])
    return label + (f"_s{seed}" if seed is not None else "")


def spec_from_flags(
    recipes: list[str],
    lrs: list[float] | None,
    seeds: list[int] | None,
    steps: int | None = None,
    overrides: list[str] | None = None,
) -> StudySpec:
    """The study the flags alone describe (no file): recipes x lrs x seeds."""
    entries = [StudyRecipe(find_recipe(r).stem, find_recipe(r)) for r in recipes]
    spec = StudySpec(
        name="study",
        recipes=entries,
        grid={LR: list(lrs)} if lrs else {},
        seeds=list(seeds) if seeds is not None else [],
        steps=steps,
        overrides=list(overrides or []),
    )
    spec.protocol["lr_sensitivity"] = bool(lrs) and len(lrs) >= 2
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"recipes, learning rates or seeds given twice: {recipes}")
    check_spec(spec)
    return spec


def plan(spec: StudySpec, out: Path, window: int | None = None) -> list[Planned]:
    """Every run's validated config (all checked before any training starts)."""
    planned = []
    combos = itertools.product(*spec.grid.values())
    points = [dict(zip(spec.grid, vals, strict=True)) for vals in combos]
    for entry in spec.recipes:
        for point in points:
            for seed in entry.seeds or spec.seeds or [None]:
                label = run_dir_name(entry.label, point, seed)
                extra = [f"training.steps={spec.steps}"] if spec.steps is not None else []
                extra += [f"{k}={json.dumps(v)}" for k, v in point.items()]
                extra += [f"training.seed={seed}"] if seed is not None else []
                extra += [f"name={entry.label}", f"run_dir={out / 'runs' / label}"]
                try:
                    cfg = load_config(entry.path, [*spec.overrides, *entry.overrides, *extra])
                except ConfigError as exc:
                    at = ", ".join(f"{k}={v}" for k, v in point.items()) or "its recipe"
                    raise ConfigError(f"{entry.label} at {at}: {exc}") from None
                size = f"{spec.size.rsplit('.', 1)[-1]}={point[spec.size]}" if spec.size else "-"
                planned.append(
                    Planned(
                        _observe(cfg, window), entry.label, size, cfg.optim.lr, cfg.training.seed
                    )
                )
    dirs = [p.cfg.run_dir for p in planned]
    if len(set(dirs)) != len(dirs):
        raise ConfigError("recipes, grid values or seeds give two runs the same directory")
    return planned


def study_configs(
    recipes: list[str],
    out: Path,
    overrides: list[str],
    steps: int | None,
    window: int | None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
) -> list[RunConfig]:
    """A flags-only study's runs (lrs / seeds None: each recipe's own, in DIR/runs/<recipe>)."""
    spec = spec_from_flags(recipes, lrs, seeds, steps, overrides)
    return [p.cfg for p in plan(spec, out, window)]


def _observe(cfg: RunConfig, window: int | None) -> RunConfig:
    """Every observational instrument on; the spike window fitted to the run length."""
    for instrument in OBSERVERS:
        cfg.instruments.setdefault(instrument, True)
    score = cfg.instruments.get("spike_score")
    settings = dict(score) if isinstance(score, dict) else {}
    settings["window"] = spike_window(cfg.training.steps, window)  # the study's choice
    cfg.instruments["spike_score"] = settings
    return cfg


def write_plan(spec: StudySpec, planned: list[Planned], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs = [
        {"run_dir": p.cfg.run_dir, "recipe": p.recipe, "size": p.size, "lr": p.lr, "seed": p.seed}
        for p in planned
    ]
    body = {"study": spec.name, "file": str(spec.path) if spec.path else None, "runs": runs}
    tmp = out / f".{PLAN}.tmp"
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(out / PLAN)
