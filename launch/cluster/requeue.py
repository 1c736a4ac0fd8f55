"""Last line of every normlab batch script: requeue the job when the run stopped for USR1.

`python -m normlab.launch.cluster.requeue RUN_DIR --stopped-by USR1|TERM|none --exit-code N`

Requeue only when all hold: the batch shell got USR1 (the time limit is near), and the run's
summary says "preempted" (the ranks wrote their checkpoint and stopped cleanly). A run that
completed, diverged or crashed is not requeued (a crash would only crash again), and neither is
one stopped by TERM: that is scancel (stop) or scheduler preemption (SLURM requeues by itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SUMMARY = "summary.json"


def decide(run_dir: Path, stopped_by: str) -> tuple[bool, str]:
    """(requeue?, reason) from the batch shell's signal and the run's summary."""
    from normlab.launch.rundir.runfiles import DamagedFile, read_summary

    try:
        status = read_summary(run_dir / SUMMARY).get("status")
    except DamagedFile:
        status = None  # in the batch shell: a damaged summary is not requeued, and says so below
    if status == "completed":
        return False, "the run is complete"
    if stopped_by != "USR1":
        reason = "scancel or scheduler preemption" if stopped_by == "TERM" else "no USR1"
        return False, f"run status {status!r}, stopped by {stopped_by} ({reason}): not requeued"
    if status != "preempted":
        return False, f"run status {status!r} after USR1 (no clean checkpoint stop): not requeued"
    return True, "the run checkpointed for USR1 and is not finished: requeued"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m normlab.launch.cluster.requeue")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--stopped-by", default="none", help="USR1, TERM or none")
    p.add_argument("--exit-code", type=int, default=0, help="the job step's exit status")
    args = p.parse_args(argv)
    job = os.environ.get("SLURM_JOB_ID")
    requeue, reason = decide(args.run_dir, args.stopped_by)
    print(f"normlab: job {job}: {reason}", flush=True)
    if requeue and job:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if done.returncode != 0:  # e.g. the job is being cancelled meanwhile
            print(f"normlab: scontrol requeue {job} failed: {done.stderr.strip()}", flush=True)
            return 1
        return 0
    return 0 if reason == "the run is complete" else (args.exit_code or 1)


if __name__ == "__main__":
    sys.exit(main())
