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
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from launch.commands.compare import compare
from launch.commands.submit import add_submit_options, job_spec
from launch.config import RunConfig, from_dict, load_config
from launch.config.loader import find_recipe
from launch.errors import ConfigError

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


def _train_one(cfg: RunConfig, console: Console, force: bool = False) -> dict[str, Any]:
    """Train (or resume, or reuse) one run; its timing row."""
    from launch.training.trainer import Trainer  # heavy imports after the arguments are checked

    t0 = time.perf_counter()
    trainer = Trainer(cfg, force=force, console=console)
    status = trainer.run()
    return {
        "recipe": cfg.name,
        "lr": cfg.optim.lr,
        "seed": cfg.training.seed,
        "run_dir": cfg.run_dir,
        "status": trainer.summary.get("status", "completed" if status == 0 else "failed"),
        "seconds": round(time.perf_counter() - t0, 1),
        "signal": trainer.stopped_by,  # 0, or the signal that stopped it (with a checkpoint)
    }


_STOP: Any = None  # in a worker: the study's stop event (set once a signal stopped the study)
_PARENT = 0  # in a worker: the study's pid


def _init_worker(event: Any) -> None:
    """Pool-worker start: remember the study's stop event, and watch the study process: once it
    is gone (even SIGKILLed), SIGTERM this worker once, so no run trains on unsupervised (the
    trainer checkpoints and stops; an idle worker just exits). A parent-death signal would do
    it without a thread, but Linux repeats it as each thread of the parent exits, and a second
    SIGTERM makes the trainer exit without its checkpoint."""
    global _STOP, _PARENT
    _STOP, _PARENT = event, os.getppid()
    threading.Thread(target=_signal_when_orphaned, daemon=True).start()


def _signal_when_orphaned() -> None:
    while os.getppid() == _PARENT:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def _train_in_worker(plain: dict[str, Any], header: str, force: bool) -> dict[str, Any] | None:
    """One run in a spawned worker process (the config travels as its plain dict); None when
    the study was stopped before it began. Plain lines, no live bar: two bars from two processes
    would overwrite each other."""
    if _STOP is not None and _STOP.is_set():
        return None
    tty = sys.stdout.isatty()
    console = Console(
        force_terminal=False, width=shutil.get_terminal_size().columns if tty else 240
    )
    console.rule(header)
    row = _train_one(from_dict(plain), console, force)
    if os.getppid() != _PARENT:  # the study died (the run stopped with a checkpoint): nobody
        os._exit(128 + signal.SIGTERM)  # reads the result, and the pool's queues never close
    return row


def train_all(
    cfgs: list[RunConfig],
    console: Console,
    jobs: int = 1,
    force: bool = False,
    headers: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Every run, `jobs` at a time (separate processes when jobs > 1); timing rows in cfgs order.

    headers: the line printed as each run starts (default: 'study i/n: name -> run_dir')."""
    if headers is None:
        headers = [f"study {i}/{len(cfgs)}: {c.name} -> {c.run_dir}" for i, c in enumerate(cfgs, 1)]
    if jobs <= 1 or len(cfgs) <= 1:
        timings = []
        for header, cfg in zip(headers, cfgs, strict=True):
            console.rule(header)
            timings.append(_train_one(cfg, console, force))
            if timings[-1]["signal"]:  # preempted or interrupted: start no further run
                break
        return timings
    return _train_in_workers(cfgs, jobs, force, headers)


def _train_in_workers(
    cfgs: list[RunConfig], jobs: int, force: bool, headers: list[str]
) -> list[dict[str, Any]]:
    """train_all's parallel path. A signal to the study (SIGTERM to its process, or to the group
    when the workers get it too) starts no further run; the timing rows stop there."""
    from launch.training.datasets import resolve_dataset

    for data in {json.dumps(c.to_dict()["data"], sort_keys=True): c.data for c in cfgs}.values():
        resolve_dataset(data)  # prepared once here, not by two workers at the same time
    # spawn, not fork: each worker starts its own torch (thread pools do not survive a fork)
    context = multiprocessing.get_context("spawn")
    stopped = context.Event()  # also seen by a run already queued to a worker
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_init_worker, initargs=(stopped,)
    ) as pool:
        futures = [
            pool.submit(_train_in_worker, c.to_dict(), h, force)
            for c, h in zip(cfgs, headers, strict=True)
        ]

        def stop(signum: int, frame: object) -> None:  # the running runs finish, no new one starts
            stopped.set()
            for future in futures:
                future.cancel()

        previous = signal.signal(signal.SIGTERM, stop)
        timings = []
        try:
            for future in futures:
                row = None if future.cancelled() else future.result()
                if row is None:
                    break
                timings.append(row)
                if row["signal"]:
                    stop(row["signal"], None)
        except BaseException:  # a run failed, or Ctrl-C: start nothing more
            stop(signal.SIGINT, None)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        return timings


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
    from launch.report.study import write_study_report

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


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    lrs = None if args.lrs == "recipe" else _floats(args.lrs, "--lrs")
    seeds = _ints(args.seeds, "--seeds")
    if args.submit:
        from launch.cluster.study import submit_study

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
