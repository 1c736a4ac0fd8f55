"""`normlab coordcheck RECIPE [--widths W,...] [--depths L,...] [--steps K] [--out DIR]
[KEY=VALUE ...]`: is the recipe's parametrization implemented right? (SCIENCE.md 21.5)

A few AdamW steps on one fixed batch at each width (d_head fixed, heads added, d_ff in
proportion) and/or depth, 3 seeds; per layer class the mean |x| per coordinate at t = 1..k, its
log-log slope against size, the plot the mup package draws (coord_<axis>.png) and
coordcheck.json. Exit status 0 when every class passes |slope| <= 0.15, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from normlab.launch.errors import ConfigError
from normlab.launch.report.outdir import check_out_dir, make_out_dir, write_text

DEFAULT_WIDTHS = "64,128,256,512"
LR_FACTOR = 10.0  # SCIENCE.md 21.5: AdamW lr at 10x the base model's (the recipe's optim.lr)


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
    p.add_argument("--steps", type=int, default=10, help="steps t = 1..k (default 10)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per size (default 3)")
    p.add_argument("--out", default="coordcheck", help="report folder (default ./coordcheck)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe
    from normlab.launch.transfer.coordcheck import CoordSetup, as_json, coord_check
    from normlab.launch.transfer.coordplot import plot_coords

    cfg = load_config(find_recipe(args.recipe), args.overrides)
    widths, depths = _sizes("--widths", args.widths), _sizes("--depths", args.depths)
    if widths is None and depths is None:
        widths = _sizes("--widths", DEFAULT_WIDTHS)
    lr = cfg.optim.lr * LR_FACTOR
    shape = dict(steps=args.steps, seeds=args.seeds, lr=lr, seq_len=min(cfg.data.seq_len, 64))
    try:
        setups = [CoordSetup(a, s, **shape) for a, s in (("width", widths), ("depth", depths)) if s]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = Path(args.out)
    check_out_dir(out)
    torch.set_num_threads(cfg.training.threads or 1)
    model_cfg = cfg.model_config()
    results = []
    for setup in setups:
        try:
            results.append(coord_check(model_cfg, setup, cfg.optim))
        except ValueError as exc:
            raise ConfigError(f"--{setup.axis}s: {exc}") from None
    make_out_dir(out)
    title = f"{cfg.name} ({model_cfg.parametrization})"
    checks: list[dict] = []
    report = {"recipe": cfg.name, "parametrization": model_cfg.parametrization, "checks": checks}
    for res in results:
        png = plot_coords(res, out / f"coord_{res.setup.axis}.png", title)
        checks.append(as_json(res) | {"png": png.name})
        verdict = "pass" if res.passed else "FAIL"
        print(f"{res.setup.axis} {list(res.setup.sizes)}: {verdict}")
        for line in res.failed:
            print(f"  {line}")
    write_text(out / "coordcheck.json", json.dumps(report, indent=2))
    print(f"wrote {out / 'coordcheck.json'} and the plots")
    return 0 if all(r.passed for r in results) else 1
