"""`normlab study [RECIPES...] [--out DIR]`: the one-command stability study.

Trains each recipe in turn (default: every placement at the tiny size, Post-LN with and without
warm-up) on the bundled corpus with every observational instrument on, then writes the compare
report. Runs live in DIR/runs/<recipe>; running the study again resumes or reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from launch.commands.compare import compare
from launch.commands.submit import add_submit_options, job_spec
from launch.config import RunConfig, load_config
from launch.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"  # launch/commands/ -> repo
DEFAULT_RECIPES = [
    "post_warmup",
    "post_nowarmup",
    "pre",
    "peri",
    "olmo2",
    "deepnorm",
    "mix",
    "ln_scaling",
]
OBSERVERS = ["activations", "gradients", "attention_logits", "qk_gains"]


def recipe_path(name: str) -> Path:
    """A recipe file path, or a name in the repository's recipes/ directory."""
    path = Path(name)
    if path.is_file():
        return path
    bundled = RECIPES_DIR / f"{name.removesuffix('.yaml')}.yaml"
    if bundled.is_file():
        return bundled
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise ConfigError(f"no recipe {name!r} (a YAML file, or one of: {known})")


def spike_window(steps: int, asked: int | None) -> int:
    """OLMo 2's 1000-value window, shortened for short studies so points get scored."""
    return asked if asked is not None else min(1000, max(10, steps // 5))


def study_configs(
    recipes: list[str], out: Path, overrides: list[str], steps: int | None, window: int | None
) -> list[RunConfig]:
    """Every run's validated config (all checked before any training starts)."""
    cfgs = []
    for name in recipes:
        path = recipe_path(name)
        extra = [f"training.steps={steps}"] if steps is not None else []
        cfg = load_config(path, [*overrides, *extra, f"run_dir={out / 'runs' / path.stem}"])
        for instrument in OBSERVERS:
            cfg.instruments.setdefault(instrument, True)
        score = cfg.instruments.get("spike_score")
        settings = dict(score) if isinstance(score, dict) else {}
        settings["window"] = spike_window(cfg.training.steps, window)  # the study's choice
        cfg.instruments["spike_score"] = settings
        cfgs.append(cfg)
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names):
        raise ConfigError(f"recipes given twice: {names}")
    return cfgs


def run_study(
    recipes: list[str],
    out: str | Path,
    overrides: list[str] | None = None,
    steps: int | None = None,
    window: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train every recipe, then compare them; returns {'runs': [...], 'rows': ..., 'files': ...}."""
    from launch.training.trainer import Trainer  # heavy imports after the arguments are checked

    out = Path(out)
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    cfgs = study_configs(recipes, out, overrides or [], steps, window)
    timings = []
    start = time.perf_counter()
    for i, cfg in enumerate(cfgs, 1):
        console.print(f"[bold]study {i}/{len(cfgs)}: {cfg.name}[/bold] -> {cfg.run_dir}")
        t0 = time.perf_counter()
        trainer = Trainer(cfg, console=console)
        status = trainer.run()
        timings.append(
            {
                "recipe": cfg.name,
                "run_dir": cfg.run_dir,
                "status": trainer.summary.get("status", "completed" if status == 0 else "failed"),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    total = round(time.perf_counter() - start, 1)
    report = compare([c.run_dir for c in cfgs if c.run_dir], out, console)
    (out / "study.json").write_text(json.dumps({"total_s": total, "runs": timings}, indent=2))
    console.print(f"study: {len(cfgs)} runs in {total:.0f} s; report in {out}", highlight=False)
    return {"runs": timings, "total_s": total, **report}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "study", help="train a set of recipes and compare them (default: every placement, tiny)"
    )
    p.add_argument(
        "recipes",
        nargs="*",
        metavar="RECIPE",
        help=f"recipe files or names in recipes/ (default: {' '.join(DEFAULT_RECIPES)})",
    )
    p.add_argument("--out", default="study", help="report and runs directory (default: ./study)")
    p.add_argument("--steps", type=int, help="training.steps for every recipe")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted override applied to every recipe (repeatable), e.g. --set optim.lr=3e-3",
    )
    p.add_argument(
        "--spike-window",
        type=int,
        help="spike-score window (default: 1000, or steps/5 when shorter; OLMo 2 uses 1000)",
    )
    p.add_argument("--submit", action="store_true", help="one SLURM job per recipe instead")
    add_submit_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.submit:
        from launch.cluster.study import submit_study

        cfgs = study_configs(
            args.recipes or DEFAULT_RECIPES, Path(args.out), args.set, args.steps, args.spike_window
        )
        submit_study(cfgs, Path(args.out), job_spec(args))
        return 0
    result = run_study(
        args.recipes or DEFAULT_RECIPES, args.out, args.set, args.steps, args.spike_window
    )
    return 0 if all(r["status"] in ("completed", "diverged") for r in result["runs"]) else 1
