"""Start-up CPU time of the commands people run in a loop, against `python -c pass`.

`python benchmarks/bench_startup.py [--repeat 5] [--runs RUN_DIR RUN_DIR]` runs each command in a
fresh interpreter, interleaved with `python -c pass` so both see the same machine load, and prints
the median user+system CPU seconds of each (os.wait4 of the child) and the difference to the bare
interpreter. `status` and `compare` need finished run directories (`--runs`); without them they
are skipped. Target: `normlab --help` under 0.5 s of CPU on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "normlab.launch.cli"]


def cpu_seconds(cmd: list[str]) -> tuple[float, float, int]:
    """(user+system CPU seconds, wall seconds, status) of one run of `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - start, proc.returncode


def commands(runs: list[str], scratch: Path) -> dict[str, list[str]]:
    out = {
        "--help": ["--help"],
        "train --help": ["train", "--help"],
        "plan 7b": ["plan", "7b", "--gpus-per-node", "8", "--gpu-memory", "80GB"],
        "submit pre --dry-run": [
            "submit", "pre", "--dry-run", "--nodes", "1", "--gpus-per-node", "0",
            "--run-dir", str(scratch / "never"),
        ],
        "validate 7b --quiet": ["validate", "7b", "--quiet"],
    }  # fmt: skip
    if runs:
        out["status RUN"] = ["status", runs[0]]
        out["compare RUNS"] = ["compare", *runs, "--out", str(scratch / "compare")]
    return {name: [*CLI, *argv] for name, argv in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", nargs="*", default=[], help="finished run dirs (status, compare)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(args.runs, Path(tmp))
        bare = [sys.executable, "-c", "pass"]
        cpu: dict[str, list[float]] = {name: [] for name in ["python -c pass", *cmds]}
        wall: dict[str, list[float]] = {name: [] for name in cpu}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():  # each command right after a bare interpreter
                for label, c in (("python -c pass", bare), (name, cmd)):
                    seconds, elapsed, status = cpu_seconds(c)
                    if status != 0:
                        sys.exit(f"{label}: exit status {status}: {' '.join(c)}")
                    cpu[label].append(seconds)
                    wall[label].append(elapsed)
    base = statistics.median(cpu["python -c pass"])
    load = os.getloadavg()[0]
    print(f"median of {args.repeat} runs; load average {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'command':24} {'CPU s':>7} {'- bare':>7} {'wall s':>7}")
    for name in cpu:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:24} {c:7.3f} {c - base:7.3f} {w:7.3f}")


if __name__ == "__main__":
    main()
