"""`normlab status STUDY_DIR`: a study's progress from DIR/plan.json and each run's directory.

Each planned run is one of: done (summary 'completed'), diverged, running (a live local trainer
holds its lock, or its SLURM job is RUNNING), queued (its SLURM job is PENDING or requeued),
stopped (preempted, interrupted or killed: the same study command resumes it), failed, pending
(not started).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from normlab.launch.errors import RunDirError

PLAN = "plan.json"
ORDER = ["done", "diverged", "running", "queued", "stopped", "failed", "pending"]


def is_study_dir(path: Path) -> bool:
    return (Path(path) / PLAN).is_file()


def _plan(study: Path) -> dict[str, Any]:
    from normlab.launch.json_file import read_json

    data = read_json(study / PLAN, "study plan", RunDirError, "not a readable study plan")
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("run_dir"), str) for r in runs
    ):
        raise RunDirError(f"{study / PLAN}: 'runs' must be a list of entries with a run_dir")
    return data


def run_state(run_dir: Path) -> tuple[str, int, int]:
    """(state, step, total) of one planned run."""
    from normlab.launch.rundir.directory import read_lock, read_summary, stale_reason
    from normlab.launch.rundir.metrics import last_rows
    from normlab.launch.rundir.owner import last_job_id
    from normlab.launch.rundir.runfiles import read_config
    from normlab.launch.slurm import job_state

    step = 0
    rows = last_rows(run_dir / "metrics.jsonl", 1)
    if rows:
        step = int(rows[-1].get("step", 0))
    total = 0
    if (run_dir / "config.yaml").is_file():  # not yet there for a run that has not started
        cfg = read_config(run_dir / "config.yaml")  # damage: one line naming the file
        total = int((cfg.get("training") or {}).get("steps", 0))
    job = last_job_id(run_dir)
    slurm_state = job_state(job) if job else None
    summary = read_summary(run_dir) or {}
    status = summary.get("status")
    if status == "completed":
        return "done", step, total
    if status == "diverged":
        return "diverged", step, total
    if slurm_state == "RUNNING":
        return "running", step, total
    if slurm_state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"):
        return "queued", step, total
    owner = read_lock(run_dir)
    if owner is not None and stale_reason(run_dir, owner) is None:
        return "running", step, total
    if status == "failed":
        return "failed", step, total
    if status is None and not rows:
        return "pending", step, total
    return "stopped", step, total


def study_status(study: Path) -> dict[str, Any]:
    data = _plan(study)
    runs = []
    for entry in data["runs"]:
        state, step, total = run_state(Path(entry["run_dir"]))
        runs.append({**entry, "state": state, "step": step, "total": total})
    counts = Counter(r["state"] for r in runs)
    return {
        "study": data.get("study"),
        "dir": str(study),
        "runs": runs,
        "counts": {k: counts[k] for k in ORDER if counts[k]},
    }


def format_study_status(info: dict[str, Any]) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in info["counts"].items())
    lines = [f"study {info['study']} in {info['dir']}: {len(info['runs'])} runs: {counts}"]
    for r in info["runs"]:
        progress = f"step {r['step']}/{r['total']}" if r["total"] else ""
        lines.append(f"  {r['state']:<9} {Path(r['run_dir']).name}  {progress}".rstrip())
    if info["counts"].get("stopped"):
        lines.append("stopped runs resume when the same study command runs again")
    return "\n".join(lines)
