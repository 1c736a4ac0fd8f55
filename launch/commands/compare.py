"""`normlab compare RUN_DIR... [--out DIR]`: recipes side by side.

Prints the table and the spike report card (launch.report.card), writes them as compare.md and
compare.csv, and draws loss.png, grad_norm.png, resid_rms_by_depth.png and max_logit.png into
--out; `--plateau X` (the data's unigram loss, nats) draws it in loss.png and marks the runs that
did not train. Runs still in progress and runs that diverged
are read as they stand; a directory that is not a run is an error (exit 2). TensorBoard
directories and JSONL/CSV histories from other trainers are read too (--source, --metric:
launch/histories, docs/guides/external_runs.md).
"""

from __future__ import annotations

import argparse
import math

from normlab.launch.errors import ConfigError
from normlab.launch.histories.options import add_history_options
from normlab.launch.report.outdir import DEFAULT_OUT


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="table and plots of several runs side by side (running or finished)"
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN_DIR",
        help="run directories, TensorBoard directories or .jsonl/.csv histories",
    )  # fmt: skip
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"where the report goes (default: ./{DEFAULT_OUT})"
    )
    p.add_argument(
        "--plateau",
        type=float,
        default=None,
        help="the data's unigram loss (nats): drawn in loss.png; runs not 0.2 below it are "
        "marked as not trained",
    )
    add_history_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.histories.load import compare_inputs
    from normlab.launch.histories.options import history_options
    from normlab.launch.report.compare import compare

    if args.plateau is not None and not (math.isfinite(args.plateau) and args.plateau > 0):
        raise ConfigError(f"--plateau must be a positive finite loss, got {args.plateau}")
    compare(compare_inputs(args.runs, history_options(args)), args.out, plateau=args.plateau)
    return 0
