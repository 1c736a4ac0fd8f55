"""`normlab status RUN_DIR...`: where each run stands, local or on SLURM.

Per run: the SLURM job and its state (from slurm.json, asking squeue, then sacct), the run's
own status (summary.json), step of total, last checkpoint, last loss, tokens/s, TFLOP/s per GPU
and MFU (launch/training/mfu.py; '-' where no peak is known), an ETA from the
recent step time, and the last lines of the job's log (or the last metrics rows of a local run).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import deque
from pathlib import Path
from typing import Any

from normlab.launch.errors import RunDirError

STEP_DIR = re.compile(r"^step_(\d{8})$")  # rundir.checkpoint.STEP_DIR
TAIL = 5


def _number(value: Any) -> float | None:
    """A logged value as a float ('nan' strings included), None where absent."""
    return None if value is None else float(value)


def _tail(path: Path, n: int) -> list[str]:
    with path.open(errors="replace") as fh:
        return [ln.rstrip("\n") for ln in deque(fh, maxlen=n)]


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names, else the newest complete one; None for a broken pointer
    or none at all. Reads as rundir.checkpoint.CheckpointManager.latest does (a test holds the
    two equal) without importing torch, so `status` answers at once on a login node."""
    root = run_dir / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return root / name if STEP_DIR.match(name) and (root / name).is_dir() else None
    if not root.is_dir():
        return None
    steps = sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))
    return steps[-1] if steps else None


def run_status(run_dir: Path) -> dict[str, Any]:
    """Everything `normlab status` prints about one run, as a dict."""
    from normlab.launch.rundir.directory import CONFIG, SUMMARY
    from normlab.launch.rundir.owner import last_job_id
    from normlab.launch.rundir.runfiles import read_config, read_summary
    from normlab.launch.slurm import job_state

    if not (run_dir / CONFIG).is_file():
        raise RunDirError(f"{run_dir} is not a run directory (no {CONFIG})")
    cfg = read_config(run_dir / CONFIG)
    total = int((cfg.get("training") or {}).get("steps", 0))
    info: dict[str, Any] = {"run_dir": str(run_dir), "name": cfg.get("name"), "total": total}
    info["job_id"] = last_job_id(run_dir)
    info["job_state"] = job_state(info["job_id"]) if info["job_id"] else None
    summary = read_summary(run_dir / SUMMARY)
    info["status"] = summary.get("status", "not started")
    from normlab.launch.rundir.runfiles import read_metrics
    from normlab.launch.warning.events import events_from_summary, events_text, run_events

    every = read_metrics(run_dir / "metrics.jsonl")  # damage is one line, not skipped
    rows = [row for row in every if "loss" in row][-TAIL:]
    recorded = events_from_summary(summary)  # a running run's are found in its metrics so far
    if recorded is None or info["status"] == "running":
        recorded = run_events(every, cfg) if every else None
    info["events"] = events_text(recorded)
    last = rows[-1] if rows else {}
    info["step"] = int(last.get("step", summary.get("steps", 0)))
    info["loss"] = _number(last.get("loss"))
    info["tokens_per_s"] = _number(last.get("tokens_per_s"))
    info["tflops_per_gpu"] = _number(last.get("tflops_per_gpu"))
    info["mfu"] = _number(last.get("mfu"))  # absent where no peak is known (CPU, an unknown GPU)
    step_time = _number(last.get("step_time"))
    remaining = max(0, total - info["step"])
    timed = step_time is not None and math.isfinite(step_time) and step_time > 0
    info["eta_s"] = remaining * step_time if timed and info["status"] != "completed" else None
    latest = latest_checkpoint(run_dir)
    info["checkpoint"] = str(latest) if latest else None
    logs = sorted(run_dir.glob("slurm-*.out"), key=lambda p: p.stat().st_mtime)
    info["log"] = str(logs[-1]) if logs else None
    info["log_lines"] = (
        _tail(logs[-1], TAIL)
        if logs
        else [
            f"step {r['step']}: loss {r['loss']:.4f}"
            for r in rows
            if isinstance(r.get("loss"), float)
        ]
    )
    return info


def format_status(info: dict[str, Any]) -> str:
    job = (
        f"job {info['job_id']} {info['job_state'] or 'unknown to SLURM'}"
        if info["job_id"]
        else "local"
    )
    loss = f"{info['loss']:.4f}" if isinstance(info["loss"], float) else "-"
    tps = f"{info['tokens_per_s']:,.0f}" if info["tokens_per_s"] else "-"
    eta = _duration(info["eta_s"]) if info["eta_s"] is not None else "-"
    mfu = f"{100 * info['mfu']:.1f}%" if isinstance(info.get("mfu"), float) else "-"
    flops = info.get("tflops_per_gpu")
    tflops = f"{flops:.3g}" if isinstance(flops, float) else "-"
    lines = [
        f"{info['run_dir']} ({info['name']}): {info['status']}, {job}",
        f"  step {info['step']}/{info['total']}  loss {loss}  tokens/s {tps}  "
        f"TFLOP/s/GPU {tflops}  MFU {mfu}  ETA {eta}",
        f"  last checkpoint: {info['checkpoint'] or 'none'}",
        f"  events (SCIENCE.md 23.1): {info.get('events', '-')}",
    ]
    if info["log_lines"]:
        lines.append(f"  last lines of {info['log'] or 'metrics.jsonl'}:")
        lines += [f"    {ln}" for ln in info["log_lines"]]
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="progress of runs or studies (local or SLURM jobs)")
    p.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories, or study directories"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.study.status import format_study_status, is_study_dir, study_status

    infos = [  # every directory checked before printing; a study directory is summarised
        (study_status(Path(r)), format_study_status) if is_study_dir(Path(r))
        else (run_status(Path(r)), format_status)
        for r in args.runs
    ]  # fmt: skip
    for info, formatter in infos:
        print(json.dumps(info) if args.json else formatter(info))
    return 0
