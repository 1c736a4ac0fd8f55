"""`normlab quickstart`: the main job in one command.

Prepares the bundled corpus, trains a handful of norm placements at the tiny size on the CPU
(a few minutes in all on 2 cores) and prints one summary row per recipe.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from launch.config import load_config
from launch.training.datasets import resolve_dataset

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"  # launch/commands/ -> repo
DEFAULT = ["post_warmup", "post_nowarmup", "pre", "peri", "olmo2", "deepnorm"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("quickstart", help="train a few placements on CPU and compare them")
    p.add_argument("--recipes", default=",".join(DEFAULT), help="comma-separated recipe names")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per recipe")
    p.add_argument("--out", default="runs/quickstart", help="parent of the run directories")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    p.add_argument("--force", action="store_true", help="continue runs whose config changed")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides for every recipe"
    )
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace, name: str) -> list[str]:
    over = [f"run_dir={Path(args.out) / name}", f"training.threads={args.threads}"]
    over += list(args.overrides)
    return over + ([f"training.steps={args.steps}"] if args.steps else [])


def run(args: argparse.Namespace) -> int:
    from launch.training.trainer import Trainer

    console = Console() if sys.stdout.isatty() else Console(width=120)  # no truncated names
    names = [n.strip() for n in args.recipes.split(",") if n.strip()]
    configs = [load_config(RECIPE_DIR / f"{n}.yaml", _overrides(args, n)) for n in names]
    start = time.perf_counter()
    console.print("preparing the bundled corpus (cached after the first run)")
    resolve_dataset(configs[0].data)
    rows = []
    for cfg in configs:
        console.rule(
            f"{cfg.name}: placement {cfg.model.placement}, warm-up {cfg.schedule.warmup_steps}"
        )
        trainer = Trainer(cfg, force=args.force, console=console)
        trainer.run()
        rows.append(trainer.summary)
    console.print(summary_table(rows, time.perf_counter() - start))
    return 0 if all(r.get("status") == "completed" for r in rows) else 1


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(rows: list[dict[str, Any]], wall_s: float) -> Table:
    table = Table(title=f"normlab quickstart ({wall_s / 60:.1f} min)")
    for col in ("recipe", "steps", "final loss", "min loss", "eval loss", "tokens/s", "status"):
        table.add_column(col, justify="left" if col in ("recipe", "status") else "right")
    for r in rows:
        table.add_row(
            str(r.get("name")),
            str(r.get("steps")),
            _fmt(r.get("final_loss"), ".4f"),
            _fmt(r.get("min_loss"), ".4f"),
            _fmt(r.get("eval_loss"), ".4f"),
            _fmt(r.get("tokens_per_s"), ",.0f"),
            str(r.get("status")),
        )
    return table
