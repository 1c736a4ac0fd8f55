"""`normlab compare RUN_DIR... [--out DIR]`: recipes side by side.

Prints the table and the spike report card (launch.report.card), writes them as compare.md and
compare.csv, and draws loss.png, grad_norm.png, resid_rms_by_depth.png and max_logit.png into
--out. Runs still in progress and runs that diverged
are read as they stand; a directory that is not a run is an error (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from normlab.launch.report.card import card_markdown, print_card, report_card
from normlab.launch.report.plots import write_plots
from normlab.launch.report.runs import NotARunError, Run, load_run
from normlab.launch.report.table import depth_markdown, markdown, print_table, summarize, write_csv
from rich.console import Console

DEFAULT_OUT = "compare"


def compare(
    run_dirs: list[str | Path], out: str | Path | None, console: Console | None = None
) -> dict[str, Any]:
    """Read every run (all are checked before anything is written), then report.

    Returns {'rows': table rows, 'cards': spike report cards, 'files': paths written}."""
    if not run_dirs:
        raise NotARunError("give at least one run directory")
    runs: list[Run] = [load_run(p) for p in run_dirs]
    rows = [summarize(run) for run in runs]
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    print_table(rows, console)
    cards = [report_card(run, row["steps"]) for run, row in zip(runs, rows, strict=True)]
    print_card(cards, console)
    files: list[Path] = []
    if out is not None:
        out_dir = Path(out)
        if out_dir.exists() and not out_dir.is_dir():
            raise NotARunError(f"--out {out_dir} exists and is not a directory")
        out_dir.mkdir(parents=True, exist_ok=True)
        depth = depth_markdown(runs)
        pngs = write_plots(runs, out_dir)
        figures = "".join(f"\n![{p.stem}]({p.name})\n" for p in pngs)
        text = markdown(rows) + "\n" + card_markdown(cards) + ("\n" + depth if depth else "")
        text += figures
        (out_dir / "compare.md").write_text(text)
        write_csv(rows, out_dir / "compare.csv")
        files = [out_dir / "compare.md", out_dir / "compare.csv", *pngs]
        console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False)
    return {"rows": rows, "cards": cards, "files": files}


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
    compare(args.runs, args.out)
    return 0
