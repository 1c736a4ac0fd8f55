"""Train a study's runs (in a worker pool), then write its report; the work of `normlab study`."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

from normlab.launch import json_file as jf
from normlab.launch.errors import ConfigError
from normlab.launch.progress import Stages
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
    resume: str | None = None,
) -> dict[str, Any]:
    """Train every run (`jobs` at a time), then report. `resume`: the command that goes on with
    the study, printed when a signal stops it.

    Returns {'runs', 'total_s', 'stopped', 'rows', 'files', 'verdicts', 'curves'}; a study
    stopped by a signal returns the first three and 'signal' (no report over unfinished runs)."""
    from normlab.launch.study.report import study_plateau

    out = Path(out)
    jobs = jobs or spec.jobs
    console = console or Console(width=None if sys.stdout.isatty() else 240)
    planned = plan(spec, out, window if window is not None else spec.spike_window)
    write_plan(spec, planned, out)
    cfgs = [p.cfg for p in planned]
    start = time.perf_counter()
    # plain lines only: each run shows its own bar on a terminal (one live display at a time)
    stages = Stages("study", live=False)
    with stages.stage(f"training {len(cfgs)} runs", len(cfgs)) as tick:
        timings = train_all(cfgs, console, jobs)
        tick(len(timings))
    total = round(time.perf_counter() - start, 1)
    if len(timings) < len(cfgs) or any(t["signal"] for t in timings):
        again = f"resume with `{resume}`" if resume else "run the same command again to go on"
        console.print(
            f"study stopped after {len(timings)} of {len(cfgs)} runs (a signal); {again}: "
            "finished runs are reused, stopped ones resume",
            highlight=False,
            soft_wrap=True,  # one line: the command stays whole
        )
        # the signal that stopped it (as `launch` exits 128 + it); none recorded: the study
        # process itself was interrupted between runs (Ctrl-C)
        signum = next((t["signal"] for t in timings if t["signal"]), int(signal.SIGINT))
        return {"runs": timings, "total_s": total, "stopped": True, "signal": signum}
    plateau = study_plateau([c.to_dict() for c in cfgs], spec)  # scans the data: read once
    warn = partial(console.print, highlight=False)
    record = with_earlier_time(out / "study.json", spec.name, total, timings, warn)
    (out / "study.json").write_text(json.dumps({**record, "jobs": jobs, "runs": timings}, indent=2))
    wall, times = record["wall_s"], record["invocations"]
    with stages.stage("report: tables, figures, verdicts") as tick:
        found = report_runs(spec, planned, out, console, plateau, wall, jobs, times, total)
        tick()
    report = found.pop("compare")
    earlier = f" ({wall:.0f} s over {times} invocations)" if times > 1 else ""
    console.print(
        f"study: {len(cfgs)} runs in {total:.0f} s{earlier}; report in {out}", highlight=False
    )
    return {"runs": timings, "total_s": total, "stopped": False, **report, **found}


def report_runs(
    spec: StudySpec,
    planned: list[Any],
    out: Path,
    console: Console,
    plateau: float | None,
    wall: float | None = None,
    jobs: int | None = None,
    invocations: int | None = None,
    last_s: float | None = None,
) -> dict[str, Any]:
    """The compare report and the study's report of finished runs (no training); without the
    times, the earlier ones from study.json. Returns write_study_report's dict and 'compare'."""
    from normlab.launch.report.compare import compare
    from normlab.launch.study.report import write_study_report

    if wall is None:
        record = (out / "study.json").is_file() and jf.read_json(
            out / "study.json", "study record", ConfigError, "fix or move it"
        )  # the one JSON reader: damage is one line, not a report with a zero time
        record = record if isinstance(record, dict) else {}
        wall = float(record.get("wall_s", record.get("total_s", 0.0)) or 0.0)
        jobs = jobs or int(record.get("jobs") or spec.jobs)
        invocations = int(record.get("invocations") or 1)
    quiet = Console(file=open("/dev/null", "w"), width=240)  # noqa: SIM115 (table goes to compare.md)
    dirs = [p.cfg.run_dir for p in planned if p.cfg.run_dir]
    report = compare(dirs, out, quiet, plateau=plateau)
    found = write_study_report(
        planned, spec, out, wall, console, jobs or 1, invocations or 1, last_s, plateau=plateau
    )
    return {**found, "compare": report}


def with_earlier_time(
    path: Path,
    name: str,
    total: float,
    timings: list[dict[str, Any]],
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """This invocation's time with the earlier ones of the same study in the same directory
    (study.json): a finished study run again to rewrite its report reuses every run in seconds,
    and the report should still say what training them took. Each run's `seconds_total` adds
    its earlier seconds (a run resumed after a stop counts both parts). An invocation that was
    killed before the report left no study.json and is not counted. A study.json of this study
    that is damaged (not JSON, or values of the wrong type) counts from here, with a line to
    `warn`; another study's file counts from here without one."""
    earlier = _earlier_record(path, name, warn or (lambda line: print(line, file=sys.stderr)))
    before = {r.get("run_dir"): r for r in earlier.get("runs", [])}
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


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _earlier_record(path: Path, name: str, warn: Callable[[str], None]) -> dict[str, Any]:
    """study.json's record when it is this study's and every value has its type, else {}."""
    from normlab.launch.json_file import BadJSON, read_json

    if not path.is_file():
        return {}
    try:  # the one JSON reader: UTF-8, syntax, no key given twice
        earlier = read_json(path, "study record")
    except BadJSON as exc:
        warn(f"study: {path} is unreadable ({exc}); the study's time counts from here")
        return {}
    if not isinstance(earlier, dict) or earlier.get("study") != name:
        return {}  # another study's file (or none of ours): nothing to add
    runs = earlier.get("runs", [])
    bad = [k for k in ("total_s", "wall_s") if k in earlier and not is_number(earlier[k])]
    invocations = earlier.get("invocations", 1)
    if not isinstance(invocations, int) or isinstance(invocations, bool) or invocations < 0:
        bad.append("invocations")
    if not isinstance(runs, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("run_dir"), str | None)
        and all(is_number(r[k]) for k in ("seconds", "seconds_total") if k in r)
        for r in runs
    ):
        bad.append("runs")
    if bad:
        warn(
            f"study: {path} is unreadable ({', '.join(bad)} of the wrong type); the study's time "
            "counts from here"
        )
        return {}
    return earlier


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
