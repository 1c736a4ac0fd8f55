"""`normlab theory [--out DIR]`: Xiong et al. (2020) at initialisation, in seconds on a CPU.

Measures Lemma 2 (stream energy by depth), Theorem 1 (last-MLP gradient against depth) and the
per-layer gradient profile of their Figure 3 for Post-LN and Pre-LN, prints whether each
prediction held by the rule printed beside it, and writes theory.md, theory.json and three PNGs.
Differences from the paper are reported as measured (SCIENCE.md section 3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.errors import ConfigError
from normlab.launch.out_path import (
    WRITES,
    OutDirError,
    check_out_dir,
    default_out,
    make_out_dir,
    write_text,
)

if TYPE_CHECKING:
    from rich.table import Table


def _depths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--depths must be comma-separated integers, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "theory", help="Post-LN vs Pre-LN at initialisation (Xiong et al. 2020): table and plots"
    )
    p.add_argument(
        "--out", default=default_out("theory"), help="where the report goes (default: runs/theory)"
    )
    p.add_argument("--d-model", type=int, default=128, help="model width d (default 128)")
    p.add_argument(
        "--d-ff-mult",
        type=int,
        default=1,
        help="MLP width as a multiple of d (default 1, Lemma 2's setting; 4 predicts 1.32 d)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=24,
        help="models per point, resampled for each verdict's interval (default 24)",
    )
    p.add_argument("--depths", default="2,4,8,16", help="L values for Theorem 1 (default 2,4,8,16)")
    p.add_argument("--layers", type=int, default=8, help="L of the by-layer panels (default 8)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: these models are small; more threads contend "
        "on a busy CPU, 20x slower measured under load)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from normlab.launch.theory.checks import checks
    from normlab.launch.theory.measure import TheorySetup, measure
    from normlab.launch.theory.plots import markdown, write_plots

    try:
        setup = TheorySetup(
            d_model=args.d_model,
            d_ff_mult=args.d_ff_mult,
            seeds=args.seeds,
            depths=_depths(args.depths),
            profile_depth=args.layers,
            lemma_depth=args.layers,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    out = Path(args.out)
    check_out_dir(out, writes=WRITES["theory"])  # before the measurement, not after it
    torch.set_num_threads(args.threads)
    start, cpu = time.perf_counter(), time.process_time()
    res = measure(setup)
    found = checks(res)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    make_out_dir(out, writes=WRITES["theory"])
    try:
        pngs = write_plots(res, out)
    except OSError as exc:
        raise OutDirError(f"cannot write the figures into {out}: {exc.strerror or exc}") from None
    write_text(out / "theory.md", markdown(res, found, pngs, seconds, cpu, command_line(args)))
    data = _as_json(res, found, seconds) | {"cpu_s": round(cpu, 2), "command": command_line(args)}
    write_text(out / "theory.json", json.dumps(data, indent=2))
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(_table(found, seconds))
    console.print(f"wrote {out / 'theory.md'}, theory.json, {', '.join(p.name for p in pngs)}")
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this report (every option that differs from its default)."""
    defaults = {"d_model": 128, "d_ff_mult": 1, "seeds": 24, "depths": "2,4,8,16", "layers": 8}
    parts = ["normlab theory", f"--out {args.out}"]
    for key, default in defaults.items():
        if getattr(args, key) != default:
            parts.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    return " ".join(parts)


def _table(found: list, seconds: float) -> Table:
    from normlab.launch.theory.checks import SHOWN
    from rich.table import Table

    table = Table(title=f"normlab theory: Xiong et al. 2020 at initialisation ({seconds:.1f} s)")
    for col in ("prediction", "rule", "measured", "held"):
        table.add_column(col)
    for c in found:
        colour = {"held": "green", "failed": "red"}.get(c.verdict, "yellow")
        table.add_row(c.claim, c.rule, c.measured, f"[{colour}]{SHOWN[c.verdict]}")
    return table


def _as_json(res, found: list, seconds: float) -> dict:  # noqa: ANN001
    from dataclasses import asdict

    return {
        "setup": asdict(res.setup),
        "seconds": round(seconds, 2),
        "checks": [asdict(c) for c in found],
        "lemma2": {p: v.tolist() for p, v in res.lemma2.items()},
        "theorem1": {p: v.tolist() for p, v in res.theorem1.items()},
        "profile": {p: v.tolist() for p, v in res.profile.items()},
    }
