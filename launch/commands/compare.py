"""`normlab compare RUN_DIR... [--out DIR]`: recipes side by side.

Prints the table and the spike report card (launch.report.card), writes them as compare.md and
compare.csv, and draws loss.png, grad_norm.png, resid_rms_by_depth.png and max_logit.png into
--out. Runs still in progress and runs that diverged
are read as they stand; a directory that is not a run is an error (exit 2).
"""

from __future__ import annotations

import argparse

from normlab.launch.report.outdir import DEFAULT_OUT


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="table and plots of several runs side by side (running or finished)"
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"where the report goes (default: ./{DEFAULT_OUT})"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.report.compare import compare

    compare(args.runs, args.out)
    return 0
