"""`normlab quickstart`: the main job in one command, showing why warm-up and norm placement matter.

Prepares the bundled corpus, then trains the recipes in recipes/quickstart/ on the CPU, two at a
time with one thread each: 12 blocks of the tiny width at lr 1e-3, Adam betas (0.9, 0.999), 250
steps. In the 3-seed sweep of this setting (docs/quickstart_sweep.md) Post-LN without warm-up
stayed on the unigram plateau on every seed, while Post-LN with 100 warm-up steps, Pre-LN without
warm-up and DeepNorm with warm-up trained on every seed. It ends with the compare report
(stability columns, PNGs), two lines on what to look at, and the next command.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from normlab.launch.errors import ConfigError

DEFAULT = [
    "quickstart/post_nowarmup",
    "quickstart/post_warmup",
    "quickstart/pre_nowarmup",
    "quickstart/deepnorm_warmup",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "quickstart", help="train Post-LN with and without warm-up, Pre-LN and DeepNorm; compare"
    )
    p.add_argument("--recipes", default=",".join(DEFAULT), help="comma-separated recipe names")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per recipe")
    p.add_argument(
        "--out",
        default="runs/quickstart",
        help="parent of the run directories (default: runs/quickstart)",
    )
    p.add_argument(
        "--jobs", type=int, default=2, help="runs trained at once, each in its own process"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads per run (default 1: two 1-thread runs side by side train faster than "
        "one 2-thread run after the other on a 2-core CPU)",
    )
    p.add_argument("--force", action="store_true", help="continue runs whose config changed")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides for every recipe"
    )
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace, run_dir: Path) -> list[str]:
    over = [f"run_dir={run_dir}", f"training.threads={args.threads}"]
    over += list(args.overrides)
    return over + ([f"training.steps={args.steps}"] if args.steps is not None else [])


def run(args: argparse.Namespace) -> int:
    for flag in ("jobs", "threads"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe
    from normlab.launch.report.compare import compare
    from normlab.launch.study.pool import train_all
    from normlab.launch.study.unigram import dataset_unigram_loss
    from normlab.launch.training.datasets import resolve_dataset
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=240)  # no truncated names
    names = [n.strip() for n in args.recipes.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--recipes names no recipe: {args.recipes!r}")
    paths = [find_recipe(n) for n in names]
    out = Path(args.out)
    from normlab.launch.out_path import check_out_dir

    # a file, below a file, read-only, a folder of other files: one line before training (it
    # holds one run directory per recipe and report/, from an earlier quickstart)
    check_out_dir(out, writes=[*(p.stem for p in paths), "report"])
    configs = [load_config(p, _overrides(args, out / p.stem)) for p in paths]
    start = time.perf_counter()
    console.print("preparing the bundled corpus (cached after the first run)")
    plateau = dataset_unigram_loss(resolve_dataset(configs[0].data))
    headers = [
        f"{c.name}: placement {c.model.placement}, {c.model.n_layers} blocks, "
        f"lr {c.optim.lr:g}, warm-up {c.schedule.warmup_steps}"
        for c in configs
    ]
    timings = train_all(configs, console, args.jobs, args.force, headers)
    if len(timings) < len(configs) or any(t["signal"] for t in timings):
        console.print("quickstart stopped (a signal); run it again to go on", highlight=False)
        return 1
    statuses = [t["status"] for t in timings]
    minutes = (time.perf_counter() - start) / 60
    report = compare([c.run_dir for c in configs if c.run_dir], out / "report", console, plateau)
    console.print(f"normlab quickstart: {len(configs)} runs in {minutes:.1f} min", highlight=False)
    for line in what_to_look_at(report["rows"], out / "report", plateau):
        console.print(line, highlight=False)
    return 0 if all(s == "completed" for s in statuses) else 1


def what_to_look_at(rows: list[dict[str, Any]], report: Path, plateau: float) -> list[str]:
    """Two lines read off this run's numbers, then the next command.

    `plateau`: the unigram loss of the data (launch.study.unigram), where a stalled run sits."""
    scored = [r for r in rows if r.get("eval_loss") is not None]
    lines = []
    if len(scored) >= 2:
        worst = max(scored, key=lambda r: r["eval_loss"])
        best = min(scored, key=lambda r: r["eval_loss"])
        lines.append(
            f"Look at: {worst['run']} ends at eval loss {worst['eval_loss']:.3f} against "
            f"{best['eval_loss']:.3f} for {best['run']}; {plateau:.3f} is this data's unigram "
            "plateau (predicting token frequencies and nothing else) - see loss.png."
        )
    lines.append(
        f"Then: grad_norm.png and resid_rms_by_depth.png in {report} show how each placement got "
        "there (gradient size against the clip line, residual growth by depth); compare.md has "
        "the table."
    )
    lines.append(
        "Next: `normlab study lr12` (these 12-block recipes at lr 3e-4, 1e-3 and 3e-3 on 2 seeds: "
        "where each placement stops training, as LR sensitivity; 24 runs, 34 min measured on two "
        "idle cores) or `normlab theory` (the same placements at initialisation, seconds)."
    )
    return lines
