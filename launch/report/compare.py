"""Recipes side by side (the work of `normlab compare`): read every run, print the table and the
spike report card, write compare.md, compare.csv and the figures."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from normlab.launch.report.card import card_markdown, print_card, report_card
from normlab.launch.report.outdir import OutDirError, check_out_dir, make_out_dir, write_text
from normlab.launch.report.plots import untrained_note, write_plots
from normlab.launch.report.provenance import mixed_warnings
from normlab.launch.report.table import csv_text, depth_markdown, markdown, print_table, summarize
from normlab.launch.rundir.runs import NotARunError, Run, load_run
from rich.console import Console


def compare(
    run_dirs: Sequence[str | Path | Run],
    out: str | Path | None,
    console: Console | None = None,
    plateau: float | None = None,
) -> dict[str, Any]:
    """Read every run (all are checked before anything is written), then report. `plateau`:
    the data's unigram loss where the caller knows it (study, quickstart), drawn in loss.png.
    A Run given in place of a directory is used as it is (a history from another trainer,
    launch/histories).

    Returns {'rows': table rows, 'cards': spike report cards, 'files': paths written,
    'warnings': lines on runs that are not comparable, and the runs that did not train}."""
    if not run_dirs:
        raise NotARunError("give at least one run directory")
    if out is not None:
        check_out_dir(Path(out))
    runs: list[Run] = [p if isinstance(p, Run) else load_run(p) for p in run_dirs]
    rows = [summarize(run) for run in runs]
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    print_table(rows, console)
    warnings = mixed_warnings([r.label for r in runs], [r.config for r in runs])
    note = untrained_note(runs, plateau)
    warnings += [note] if note else []
    for line in warnings:
        console.print(line, style="yellow", highlight=False)
    cards = [report_card(run, row["steps"]) for run, row in zip(runs, rows, strict=True)]
    print_card(cards, console)
    files: list[Path] = []
    if out is not None:
        out_dir = make_out_dir(Path(out))
        depth = depth_markdown(runs)
        try:
            pngs = write_plots(runs, out_dir, plateau)
        except OSError as exc:
            raise OutDirError(f"cannot write the figures into {out_dir}: {exc.strerror}") from None
        figures = "".join(f"\n![{p.stem}]({p.name})\n" for p in pngs)
        notes = "".join(f"\n**{line}**\n" for line in warnings)
        text = markdown(rows) + notes + "\n" + card_markdown(cards)
        text += ("\n" + depth if depth else "") + figures
        write_text(out_dir / "compare.md", text)
        write_text(out_dir / "compare.csv", csv_text(rows))
        files = [out_dir / "compare.md", out_dir / "compare.csv", *pngs]
        console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False)
    return {"rows": rows, "cards": cards, "files": files, "warnings": warnings}
