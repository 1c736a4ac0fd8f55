"""The SLURM job record a run directory keeps (slurm.json) and whether a live job owns it.

A leaf beside launch.slurm: the run-directory lock (rundir/directory.py) asks it before a local
trainer takes a directory, and submission (cluster/jobs.py) before a job does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from normlab.launch import slurm
from normlab.launch.errors import RunDirError
from normlab.launch.json_file import read_json

RECORD = "slurm.json"


def read_record(run_dir: Path) -> dict[str, Any]:
    """slurm.json ({"jobs": []} when absent); a damaged one is one RunDirError line, not an empty
    record (the owner check and the next submission would otherwise forget the run's jobs)."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return {"jobs": []}
    data = read_json(path, "job record", RunDirError, "fix or move it")
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise RunDirError(f"{path}: expected a mapping with a 'jobs' list; fix or move it")
    return data


def last_job_id(run_dir: Path) -> str | None:
    jobs = [j for j in read_record(run_dir)["jobs"] if isinstance(j, dict) and j.get("job_id")]
    return str(jobs[-1]["job_id"]) if jobs else None


def check_not_owned(run_dir: Path) -> None:
    job = last_job_id(run_dir)
    if job is None:
        return
    state = slurm.job_state(job)
    if state in slurm.LIVE_STATES:
        raise RunDirError(
            f"run_dir {run_dir} belongs to SLURM job {job}, which is {state}: wait for it, "
            f"`scancel {job}`, or choose another run_dir"
        )


def check_owner_job(run_dir: Path) -> None:
    """`train`/`launch`: refuse a run directory whose last submitted job is still pending or
    running, unless this process is that job. Without SLURM's tools there is nothing to ask."""
    job = last_job_id(Path(run_dir))
    if job is not None and os.environ.get("SLURM_JOB_ID") != job:
        check_not_owned(Path(run_dir))
