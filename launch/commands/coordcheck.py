"""`normlab coordcheck RECIPE [--widths W,...] [--depths L,...] [--steps K] [--seeds N]
[--check-seed S] [--no-controls] [--out DIR] [KEY=VALUE ...]`: is the recipe's parametrization
implemented right? (docs/SCIENCE.md 21.5)

A few AdamW steps at the recipe's lr on one fixed batch at each width (d_head fixed, heads added,
d_ff in proportion) and/or depth; per seed and check the log-log slope against size, a 95 % t
interval over the seeds against the known exponent ± 0.25. Beside the recipe its negative
controls (deliberate mistakes) run, and each must fail. Writes coord_<axis>.png and
coordcheck.json. Exit status 0 pass, 1 fail, 3 inconclusive (add seeds or sizes, or a control
was not caught); the reason in one line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from normlab.launch.errors import ConfigError
from normlab.launch.progress import Stages
from normlab.launch.report.outdir import check_out_dir, make_out_dir, write_text

DEFAULT_WIDTHS = "64,128,256,512"
DEFAULT_STEPS, DEFAULT_SEEDS = 4, 6  # docs/SCIENCE.md 21.5: the loss falls at every step
LR_FACTOR = 1.0  # AdamW lr = the recipe's optim.lr (10x put the later steps in a loss spike)


def _sizes(flag: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated integers, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "coordcheck", help="coordinate check of the recipe's parametrization (mup/completep)"
    )
    p.add_argument("recipe", help="recipe YAML or name")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, as train")
    p.add_argument(
        "--widths", help=f"d_model values (default {DEFAULT_WIDTHS} unless only --depths is given)"
    )
    p.add_argument("--depths", help="n_layers values, e.g. 2,4,8,16 (CompleteP's depth check)")
    p.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help=f"steps t = 1..k (default {DEFAULT_STEPS})"
    )
    p.add_argument(
        "--seeds", type=int, default=DEFAULT_SEEDS, help=f"seeds per size (default {DEFAULT_SEEDS})"
    )
    p.add_argument("--check-seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument(
        "--no-controls", action="store_true", help="skip the negative controls (no power claim)"
    )
    p.add_argument("--out", default="coordcheck", help="report folder (default ./coordcheck)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe
    from normlab.launch.transfer.coordcheck import (
        EXIT,
        INCONCLUSIVE,
        CoordSetup,
        run_check,
        verdict_json,
    )
    from normlab.launch.transfer.coordplot import plot_coords

    cfg = load_config(find_recipe(args.recipe), args.overrides)
    widths, depths = _sizes("--widths", args.widths), _sizes("--depths", args.depths)
    if widths is None and depths is None:
        widths = _sizes("--widths", DEFAULT_WIDTHS)
    shape = dict(
        steps=args.steps,
        seeds=args.seeds,
        lr=cfg.optim.lr * LR_FACTOR,
        seq_len=min(cfg.data.seq_len, 32),
        first_seed=args.check_seed,
    )
    try:
        setups = [CoordSetup(a, s, **shape) for a, s in (("width", widths), ("depth", depths)) if s]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = Path(args.out)
    check_out_dir(out)
    torch.set_num_threads(cfg.training.threads or 1)
    model_cfg = cfg.model_config()
    start = time.monotonic()
    verdicts = []
    with Stages("coordcheck") as stages:
        for setup in setups:
            with stages.stage(f"{setup.axis}s {list(setup.sizes)}") as tick:

                def progress(line: str, tick: Callable[..., None] = tick) -> None:
                    stages.line(f"[{time.monotonic() - start:5.1f}s] {line}")  # a stage's step
                    tick()

                try:
                    verdicts.append(
                        run_check(
                            model_cfg, setup, cfg.optim, not args.no_controls, progress=progress
                        )
                    )
                except ValueError as exc:
                    raise ConfigError(f"--{setup.axis}s: {exc}") from None
    make_out_dir(out)
    title = f"{cfg.name} ({model_cfg.parametrization})"
    checks: list[dict] = []
    report = {"recipe": cfg.name, "parametrization": model_cfg.parametrization, "checks": checks}
    for v in verdicts:
        png = plot_coords(v.result, out / f"coord_{v.result.setup.axis}.png", title)
        checks.append(verdict_json(v) | {"png": png.name})
        print(f"{v.result.setup.axis} {list(v.result.setup.sizes)}: {v.outcome}: {v.reason()}")
        for name, r in v.controls.items():
            caught = "caught" if r.outcome == "fail" else f"NOT caught ({r.outcome})"
            print(f"  control {name}: {caught}: {r.reason()}")
    write_text(out / "coordcheck.json", json.dumps(report, indent=2))
    print(f"wrote {out / 'coordcheck.json'} and the plots ({time.monotonic() - start:.0f} s)")
    codes = [v.exit_code for v in verdicts]
    return max(codes, key=lambda c: (c == 1, c == EXIT[INCONCLUSIVE]))
