"""The SLURM client commands normlab runs: sbatch, sinfo, squeue, sacct (and what they say)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from normlab.launch.errors import NormlabError

# states in which a job still owns its run directory (squeue/sacct spellings)
LIVE_STATES = {
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "COMPLETING",
    "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
}  # fmt: skip
TIMEOUT_S = 30


class SlurmError(NormlabError):
    """SLURM is missing, refused a request, or a request names something it does not have."""


DRY_RUN = "or use --dry-run to see the script"  # what `normlab submit` offers instead


def require(tool: str, instead: str = DRY_RUN) -> str:
    """The path of `tool`; missing, one line that names what the command offers `instead`."""
    path = shutil.which(tool)
    if path is None:
        raise SlurmError(
            f"{tool} is not installed or not on PATH: run this on a SLURM login node ({instead})"
        )
    return path


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{args[0]} failed: {exc}") from None


def partitions() -> list[str]:
    """Partition names this user can see (sinfo), default partition's '*' removed."""
    done = _run([require("sinfo"), "-h", "-o", "%P"])
    if done.returncode != 0:
        raise SlurmError(f"sinfo failed: {_last_line(done.stderr)}")
    return sorted({line.strip().rstrip("*") for line in done.stdout.split() if line.strip()})


def check_partition(name: str | None) -> None:
    if name is None:
        return
    known = partitions()
    if name not in known:
        raise SlurmError(
            f"unknown partition {name!r}: this cluster has {', '.join(known) or 'none'}"
        )


def job_state(job_id: str) -> str | None:
    """The job's state (RUNNING, PENDING, COMPLETED ...), or None when SLURM no longer knows it."""
    if shutil.which("squeue"):
        done = _run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"])
        state = done.stdout.strip().split("\n")[0].strip() if done.returncode == 0 else ""
        if state:
            return state
    if shutil.which("sacct"):
        done = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
        state = done.stdout.strip().split("\n")[0].strip() if done.returncode == 0 else ""
        if state:
            return state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    return None


def sbatch(script: Path) -> str:
    """Submit `script`; return the job id."""
    done = _run([require("sbatch"), "--parsable", str(script)])
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {_last_line(done.stderr)}")
    return done.stdout.strip().split(";")[0]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"
