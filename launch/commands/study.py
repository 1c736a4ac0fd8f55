"""`normlab study [STUDY | RECIPES...] [--lrs A,B] [--seeds 0,1] [--jobs N] [--out DIR]`.

A study file (recipes/studies/NAME.yaml, or the bare NAME; launch.study.spec) names recipes,
a grid over dotted keys (learning rate, a size axis, ...), seeds, steps and the protocol; the
flags override it. Without a file: the recipes the claims need at lr 1e-3 and 3e-3, seeds 0 and 1.
Every run trains with every observational instrument on (and l_0 measured before step 0), then
the report: the compare table, mean and spread per (recipe, size, lr), the LR-sensitivity
protocol (SCIENCE.md 19; sensitivity.csv, figures) and the claims' verdicts.
Runs live in DIR/runs/<name>; DIR/plan.json lists them before training starts (`normlab status
DIR`). Started again, a study reuses finished runs and resumes stopped or killed ones.
`--report-only` rebuilds a finished study's report in --out without training (from its runs, or
from the compare.csv a committed study keeps): the claims decided by SCIENCE.md 22.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from normlab.launch.commands.submit import add_submit_options, job_spec
from normlab.launch.config.loader import check_once
from normlab.launch.errors import ConfigError
from normlab.launch.study.plan import (
    DEFAULT_LRS,
    DEFAULT_RECIPES,
    DEFAULT_SEEDS,
    plan,
    spec_from_flags,
)
from normlab.launch.study.spec import LR, StudySpec, check_spec, is_study, load_study


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise ConfigError(f"{what} is empty: give comma-separated numbers (e.g. 1e-3,3e-3)")
    if any(not v > 0 for v in values):
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
        "study",
        help="a study file, or recipes over learning rates and seeds: the LR-sensitivity "
        "protocol and the claims",
    )
    p.add_argument(
        "recipes",
        nargs="*",
        metavar="STUDY|RECIPE",
        help="a study file or name in recipes/studies/, or recipe files or names (default: "
        f"{' '.join(DEFAULT_RECIPES)})",
    )
    p.add_argument(
        "--out",
        help="report and runs directory (default: ./study, or ./studies/NAME for a study file)",
    )
    p.add_argument("--steps", type=int, help="training.steps for every run")
    p.add_argument(
        "--lrs",
        help="comma-separated learning rates (default: the study's grid, or "
        f"{','.join(f'{v:g}' for v in DEFAULT_LRS)}); 'recipe' keeps each one's",
    )
    p.add_argument(
        "--seeds",
        help="comma-separated seeds of every run, also of recipes the file gives their own "
        f"(default: the study's, or {','.join(str(v) for v in DEFAULT_SEEDS)})",
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
        help="runs trained at once, each in its own process (default: the study's, or 1; on a "
        "CPU give each --set training.threads=N so that jobs x N fits the cores)",
    )
    p.add_argument(
        "--submit",
        action="store_true",
        help="one requeueable SLURM job per run instead; the same command again submits only "
        "what is missing",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --submit: print each run's batch script; submit and write nothing",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the report of a finished study in --out without training: from its runs, "
        "or from its committed compare.csv (verdicts.md/json by SCIENCE.md 22, the A/A "
        "self-test, sensitivity.csv, study.md's verdict section)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        type=Path,
        help="with --report-only: first join the runs of these directories of the same study "
        "(e.g. more seeds run with --seeds 2,3 --out DIR) into --out's results.csv and "
        "compare.csv; a run found twice must agree, else nothing is written",
    )
    add_submit_options(p)
    p.set_defaults(func=run)


def _refuse_replaced_sets(sets: list[str], lrs: bool, steps: bool) -> None:
    """A --set the study's own axes would silently replace is an error, not a surprise."""
    owners = {"training.seed": "--seeds", "run_dir": "--out"}
    owners |= {"optim.lr": "--lrs"} if lrs else {}
    owners |= {"training.steps": "--steps"} if steps else {}
    check_once(sets, "--set ")
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in owners:
            hint = " (or --lrs recipe to keep this one)" if key == "optim.lr" else ""
            raise ConfigError(
                f"--set {key} is replaced by the study's {owners[key]}; give it there{hint}"
            )


def _replace_own_seeds(spec: StudySpec, seeds: list[int]) -> None:
    """--seeds is every run's seeds: also those of recipe entries with their own `seeds:` (said in
    one line, since it changes what the file asks for, e.g. an A/A study's disjoint seeds)."""
    own = [e for e in spec.recipes if e.seeds is not None]
    if own:
        listed = "; ".join(f"{e.label}: {' '.join(map(str, e.seeds or []))}" for e in own)
        print(f"--seeds {','.join(map(str, seeds))} replaces the file's own seeds of ({listed})")
    for entry in own:
        entry.seeds = None
    spec.seeds = seeds


def spec_from_args(args: argparse.Namespace) -> StudySpec:
    """The study file (when the one positional is one) with the flags over it, else the flags."""
    given = args.lrs is not None and args.lrs != "recipe"  # '' is an empty list: refused
    lrs = _floats(args.lrs, "--lrs") if given else None
    seeds = _ints(args.seeds, "--seeds") if args.seeds is not None else None
    if len(args.recipes) == 1 and is_study(args.recipes[0]):
        spec = load_study(args.recipes[0])
        if args.lrs == "recipe":
            spec.grid.pop(LR, None)
            spec.protocol["lr_sensitivity"] = False
        elif lrs:
            spec.grid[LR] = lrs
        if seeds is not None:
            _replace_own_seeds(spec, seeds)
        spec.steps = args.steps if args.steps is not None else spec.steps
        _refuse_replaced_sets(args.set, LR in spec.grid, spec.steps is not None)
        spec.overrides += args.set
        check_spec(spec)
        return spec
    if args.lrs is None:
        lrs = list(DEFAULT_LRS)
    _refuse_replaced_sets(args.set, lrs is not None, args.steps is not None)
    recipes = args.recipes or DEFAULT_RECIPES
    seeds = seeds if seeds is not None else list(DEFAULT_SEEDS)
    return spec_from_flags(recipes, lrs, seeds, args.steps, args.set)


def resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command that goes on with a stopped study, runnable as printed from any directory:
    this one's flags, its recipe files and --out as absolute paths (finished runs are reused,
    stopped ones resume)."""
    import shlex

    def where(name: str) -> str:
        return str(Path(name).resolve()) if Path(name).exists() else name

    cmd = ["normlab", "study", *map(where, args.recipes), "--out", str(out.resolve())]
    for flag, value in (("--steps", args.steps), ("--lrs", args.lrs), ("--seeds", args.seeds),
                        ("--spike-window", args.spike_window), ("--jobs", args.jobs)):  # fmt: skip
        cmd += [flag, str(value)] if value is not None else []
    for item in args.set:
        cmd += ["--set", item]
    return shlex.join(cmd)


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    from normlab.launch.rundir.directory import check_lock_settings

    check_lock_settings()  # before the study directory is written
    spec = spec_from_args(args)
    out = Path(args.out or ("study" if spec.path is None else f"studies/{spec.name}"))
    from normlab.launch.out_path import check_out_dir

    # a file, below a file, read-only, a folder of a user's files: one line before anything is
    # written (a folder holding plan.json or study.json is a study's: trained on or rebuilt)
    check_out_dir(out, writes=None if args.report_only else ())
    if args.dry_run and not args.submit:
        raise ConfigError("--dry-run shows the batch scripts of --submit: give it with --submit")
    if args.merge and not args.report_only:
        raise ConfigError("--merge joins finished runs: give it with --report-only")
    if args.report_only:
        if args.submit:
            raise ConfigError("--report-only trains nothing: it cannot be given with --submit")
        import sys

        from normlab.launch.study.rebuild import rebuild
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 240)
        if args.merge:
            from normlab.launch.study.merge import merge_runs

            for line in merge_runs(spec, out, args.merge):
                console.print(line)
        rebuild(spec, out, console)
        return 0
    if args.submit:
        from normlab.launch.study.submit import submit_study

        planned = plan(spec, out, args.spike_window or spec.spike_window)
        return submit_study(planned, spec, out, job_spec(args), dry_run=args.dry_run)
    from normlab.launch.study.run import run_spec

    result = run_spec(spec, out, jobs=args.jobs, window=args.spike_window,
                      resume=resume_command(args, out))  # fmt: skip
    if result["stopped"]:  # 130 for Ctrl-C, 143 for SIGTERM: as `train` and `launch` exit
        return 128 + int(result["signal"])
    return 0 if all(r["status"] in ("completed", "diverged") for r in result["runs"]) else 1
