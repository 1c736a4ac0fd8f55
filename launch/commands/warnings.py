"""`normlab warnings STUDY_DIR|RUN_DIR...`: how early each logged signal warns of the runs'
divergences and how often it cries wolf (SCIENCE.md 23.3), against the loss itself."""

from __future__ import annotations

import argparse

from normlab.launch.histories.options import add_history_options


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "warnings", help="score precursor signals by lead time and false alarms (SCIENCE.md 23)"
    )
    p.add_argument(
        "runs", nargs="+", metavar="DIR",
        help="study or run directories, TensorBoard directories or .jsonl/.csv histories",
    )  # fmt: skip
    p.add_argument("--out", default="warnings", help="output folder (default ./warnings)")
    add_history_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.histories.load import load_runs
    from normlab.launch.histories.options import history_options
    from normlab.launch.warning.report import run_warnings

    for text in run_warnings(load_runs(args.runs, history_options(args)), args.out):
        print(text)
    return 0
