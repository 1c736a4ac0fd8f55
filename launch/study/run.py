"""Train a study's runs (in a worker pool), then write its report; the work of `normlab study`."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from normlab.launch.study.plan import (
    plan,
    spec_from_flags,
    write_plan,
)
from normlab.launch.study.pool import train_all
from normlab.launch.study.spec import StudySpec
from rich.console import Console


def run_spec(
    spec: StudySpec,
    out: str | Path,
    console: Console | None = None,
    jobs: int | None = None,
    window: int | None = None,
) -> dict[str, Any]:
    """Train every run (`jobs` at a time), then report.

    Returns {'runs', 'total_s', 'stopped', 'rows', 'files', 'verdicts', 'curves'}; a study
    stopped by a signal returns only the first three (no report over unfinished runs)."""
    from normlab.launch.report.compare import compare
    from normlab.launch.study.report import study_plateau, write_study_report

    out = Path(out)
    jobs = jobs or spec.jobs
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    planned = plan(spec, out, window if window is not None else spec.spike_window)
    write_plan(spec, planned, out)
    cfgs = [p.cfg for p in planned]
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
    plateau = study_plateau([c.to_dict() for c in cfgs], spec)  # scans the data: read once
    report = compare([c.run_dir for c in cfgs if c.run_dir], out, quiet, plateau=plateau)
    record = with_earlier_time(out / "study.json", spec.name, total, timings)
    (out / "study.json").write_text(json.dumps({**record, "jobs": jobs, "runs": timings}, indent=2))
    wall, times = record["wall_s"], record["invocations"]
    found = write_study_report(
        planned, spec, out, wall, console, jobs, times, total, plateau=plateau
    )
    earlier = f" ({wall:.0f} s over {times} invocations)" if times > 1 else ""
    console.print(
        f"study: {len(cfgs)} runs in {total:.0f} s{earlier}; report in {out}", highlight=False
    )
    return {"runs": timings, "total_s": total, "stopped": False, **report, **found}


def with_earlier_time(
    path: Path, name: str, total: float, timings: list[dict[str, Any]]
) -> dict[str, Any]:
    """This invocation's time with the earlier ones of the same study in the same directory
    (study.json): a finished study run again to rewrite its report reuses every run in seconds,
    and the report should still say what training them took. Each run's `seconds_total` adds
    its earlier seconds (a run resumed after a stop counts both parts). An invocation that was
    killed before the report left no study.json and is not counted."""
    earlier: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: count from here
        earlier = json.loads(path.read_text())
    if not isinstance(earlier, dict) or earlier.get("study") != name:
        earlier = {}
    before = {r.get("run_dir"): r for r in earlier.get("runs", []) if isinstance(r, dict)}
    for t in timings:
        old = before.get(t.get("run_dir"), {})
        spent = old.get("seconds_total", old.get("seconds", 0.0))
        t["seconds_total"] = round(spent + t["seconds"], 1)
    return {
        "study": name,
        "total_s": total,
        "wall_s": round(earlier.get("wall_s", earlier.get("total_s", 0.0)) + total, 1),
        "invocations": int(earlier.get("invocations", 1 if earlier else 0)) + 1,
    }


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
    """A flags-only study (recipes x lrs x seeds), trained and reported by run_spec."""
    spec = spec_from_flags(recipes, lrs, seeds, steps, overrides)
    return run_spec(spec, out, console, jobs, window)
