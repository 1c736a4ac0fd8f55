"""`normlab study [RECIPES...] [--lrs A,B] [--seeds 0,1] [--jobs N] [--out DIR]`: claims decided.

Trains every recipe at every learning rate and seed (default: the recipes the claims need, at
lr 1e-3 and 3e-3, seeds 0 and 1, on the bundled corpus at the tiny size) with every observational
instrument on, then writes the compare report of all runs, a table of mean and spread per
(recipe, lr), and one verdict per claim by the rule printed beside it (launch.report.claims).
Runs live in DIR/runs/<recipe>_lr<lr>_s<seed>; running the study again reuses finished runs.
--jobs N trains N runs at once, each in its own process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from normlab.launch.commands.compare import compare
from normlab.launch.commands.submit import add_submit_options, job_spec
from normlab.launch.config import RunConfig, load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.errors import ConfigError
from normlab.launch.training.parallel import train_all
from rich.console import Console

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
OBSERVERS = ["activations", "gradients", "attention_logits", "qk_gains"]


def spike_window(steps: int, asked: int | None) -> int:
    """OLMo 2's 1000-value window, shortened for short studies so points get scored."""
    return asked if asked is not None else min(1000, max(10, steps // 5))


def run_label(recipe: str, lr: float | None, seed: int | None) -> str:
    """Run directory name: the recipe alone, or with its learning rate and seed."""
    label = recipe
    if lr is not None:
        label += f"_lr{lr:g}"
    if seed is not None:
        label += f"_s{seed}"
    return label


def study_configs(
    recipes: list[str],
    out: Path,
    overrides: list[str],
    steps: int | None,
    window: int | None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
) -> list[RunConfig]:
    """Every run's validated config (all checked before any training starts).

    lrs / seeds None: each recipe's own value, in DIR/runs/<recipe>."""
    cfgs = []
    for name in recipes:
        path = find_recipe(name)
        for lr in lrs or [None]:
            for seed in seeds or [None]:
                extra = [f"training.steps={steps}"] if steps is not None else []
                extra += [f"optim.lr={lr!r}"] if lr is not None else []
                extra += [f"training.seed={seed}"] if seed is not None else []
                run_dir = out / "runs" / run_label(path.stem, lr, seed)
                cfg = load_config(path, [*overrides, *extra, f"run_dir={run_dir}"])
                cfgs.append(_observe(cfg, window))
    dirs = [c.run_dir for c in cfgs]
    if len(set(dirs)) != len(dirs):
        raise ConfigError(f"recipes, learning rates or seeds given twice: {recipes}")
    return cfgs


def _observe(cfg: RunConfig, window: int | None) -> RunConfig:
    """Every observational instrument on; the spike window fitted to the run length."""
    for instrument in OBSERVERS:
        cfg.instruments.setdefault(instrument, True)
    score = cfg.instruments.get("spike_score")
    settings = dict(score) if isinstance(score, dict) else {}
    settings["window"] = spike_window(cfg.training.steps, window)  # the study's choice
    cfg.instruments["spike_score"] = settings
    return cfg


def run_study(
    recipes: list[str],
    out: str | Path,
    overrides: list[str] | None = None,
    steps: int | None = None,
    window: int | None = None,
    console: Console | None = None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Train every run (`jobs` at a time), then report.

    Returns {'runs', 'total_s', 'stopped', 'rows', 'files', 'verdicts'}; a study stopped by a
    signal returns only the first three (no report over unfinished runs)."""
    from normlab.launch.report.study import write_study_report

    out = Path(out)
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    cfgs = study_configs(recipes, out, overrides or [], steps, window, lrs, seeds)
    start = time.perf_counter()
    timings = train_all(cfgs, console, jobs)
    total = round(time.perf_counter() - start, 1)
    if len(timings) < len(cfgs) or any(t["signal"] for t in timings):
        console.print(
            f"study stopped after {len(timings)} of {len(cfgs)} runs (a signal); run the same "
            "command again to go on: finished runs are reused, stopped ones resume",
            highlight=False,
        )
        return {"runs": timings, "total_s": total, "stopped": True}
    quiet = Console(file=open("/dev/null", "w"), width=240)  # noqa: SIM115 (table goes to compare.md)
    report = compare([c.run_dir for c in cfgs if c.run_dir], out, quiet)
    (out / "study.json").write_text(
        json.dumps({"total_s": total, "jobs": jobs, "runs": timings}, indent=2)
    )
    found = write_study_report([c.run_dir for c in cfgs if c.run_dir], out, total, console, jobs)
    console.print(f"study: {len(cfgs)} runs in {total:.0f} s; report in {out}", highlight=False)
    return {"runs": timings, "total_s": total, "stopped": False, **report, "verdicts": found}


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise ConfigError(f"{what} must be positive numbers, got {text!r}")
    return values


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"{what} must be integers >= 0, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "study", help="train recipes over learning rates and seeds; decide the claims"
    )
    p.add_argument(
        "recipes",
        nargs="*",
        metavar="RECIPE",
        help=f"recipe files or names in recipes/ (default: {' '.join(DEFAULT_RECIPES)})",
    )
    p.add_argument("--out", default="study", help="report and runs directory (default: ./study)")
    p.add_argument("--steps", type=int, help="training.steps for every run")
    p.add_argument(
        "--lrs",
        default=",".join(f"{v:g}" for v in DEFAULT_LRS),
        help="comma-separated learning rates (default: %(default)s); 'recipe' keeps each one's",
    )
    p.add_argument(
        "--seeds",
        default=",".join(str(v) for v in DEFAULT_SEEDS),
        help="comma-separated seeds (default: %(default)s)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted override applied to every run (repeatable), e.g. --set model.n_layers=12",
    )
    p.add_argument(
        "--spike-window",
        type=int,
        help="spike-score window (default: 1000, or steps/5 when shorter; OLMo 2 uses 1000)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at once, each in its own process (default: 1; on a CPU give each "
        "--set training.threads=N so that jobs x N fits the cores)",
    )
    p.add_argument("--submit", action="store_true", help="one SLURM job per recipe instead")
    add_submit_options(p)
    p.set_defaults(func=run)


def _refuse_replaced_sets(sets: list[str], lrs: bool, steps: bool) -> None:
    """A --set the study's own axes would silently replace is an error, not a surprise."""
    owners = {"training.seed": "--seeds", "run_dir": "--out"}
    owners |= {"optim.lr": "--lrs"} if lrs else {}
    owners |= {"training.steps": "--steps"} if steps else {}
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in owners:
            hint = " (or --lrs recipe to keep this one)" if key == "optim.lr" else ""
            raise ConfigError(
                f"--set {key} is replaced by the study's {owners[key]}; give it there{hint}"
            )


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    lrs = None if args.lrs == "recipe" else _floats(args.lrs, "--lrs")
    seeds = _ints(args.seeds, "--seeds")
    _refuse_replaced_sets(args.set, lrs is not None, args.steps is not None)
    if args.submit:
        from normlab.launch.cluster.study import submit_study

        recipes = args.recipes or DEFAULT_RECIPES
        cfgs = study_configs(
            recipes, Path(args.out), args.set, args.steps, args.spike_window, lrs, seeds
        )
        submit_study(cfgs, Path(args.out), job_spec(args))
        return 0
    result = run_study(
        args.recipes or DEFAULT_RECIPES,
        args.out,
        args.set,
        args.steps,
        args.spike_window,
        lrs=lrs,
        seeds=seeds,
        jobs=args.jobs,
    )
    if result["stopped"]:
        return 1
    return 0 if all(r["status"] in ("completed", "diverged") for r in result["runs"]) else 1
