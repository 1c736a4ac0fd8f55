"""Shared helpers of the distributed, launch and export tests: a tiny prepared corpus and recipe,
`normlab` subprocesses with a distinct free port each, and metrics/exit-code checks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml
from normlab.data.corpus import bundled_corpus_path
from normlab.data.prepare import prepare

# fp32 losses of 2 ranks x B/2 vs 1 rank x B agree to ~1e-6 (only the reduction order differs)
LOSS_TOL = 1e-5
SLICE_LINES = 3000


def prepare_tiny(root: Path) -> Path:
    """A 3,000-line slice of the bundled corpus with a 512-piece tokenizer (~0.5 s)."""
    src = root / "slice.txt"
    text = bundled_corpus_path().read_text()
    src.write_text("".join(text.splitlines(keepends=True)[:SLICE_LINES]))
    out = root / "prepared"
    prepare([str(src)], out, vocab_size=512, val_fraction=0.05, num_proc=1)
    return out


def write_recipe(root: Path, data_dir: Path, steps: int = 8, every: int = 4) -> Path:
    """2 layers, d 64, seq 32, global batch 4, fp32, one log row per step."""
    recipe = {
        "model": {
            "preset": "tiny",
            "n_layers": 2,
            "d_model": 64,
            "n_heads": 4,
            "d_ff": 128,
            "vocab_size": 512,
            "max_seq_len": 32,
            "dropout": 0.0,
        },
        "data": {"dataset": str(data_dir), "vocab_size": 512, "seq_len": 32, "batch_size": 4},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "cosine", "warmup_steps": 2},
        "training": {
            "steps": steps,
            "eval_every": 0,
            "eval_batches": 2,
            "log_every": 1,
            "device": "cpu",
            "threads": 1,
        },
        "logging": {"tensorboard": False, "progress": False},
        "checkpoint": {"every": every, "keep_last": 20},
    }
    path = root / f"tiny{steps}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def normlab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "normlab.launch.cli", *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch(recipe: Path, run_dir: Path, nproc: int, *overrides: str, extra: tuple = ()):
    """`normlab launch` on one node with a fresh port."""
    return normlab(
        "launch",
        str(recipe),
        *overrides,
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        "--run-dir",
        str(run_dir),
        *extra,
    )


def check_ok(proc: subprocess.CompletedProcess) -> None:
    """Exit status 0 and no rank aborted at interpreter exit."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "terminate called" not in out, out[-4000:]
    assert "built successfully" not in out, "a DeepSpeed extension was JIT-compiled"


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def assert_same_curve(run: Path, reference: dict[int, float], tol: float = LOSS_TOL) -> None:
    got = losses(run)
    assert sorted(got) == sorted(reference), (sorted(got), sorted(reference))
    worst = max(abs(got[s] - reference[s]) for s in reference)
    assert worst < tol, f"max |loss - reference| = {worst:.3g} over {len(reference)} steps"


def latest_step(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().removeprefix("step_")) if pointer.is_file() else 0


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts ranks in new sessions, so a
    process-group kill would miss them)."""
    import psutil  # a DeepSpeed dependency

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)


def start_and_kill(cmd: list[str], run_dir: Path, at_step: int, timeout: float = 120) -> int:
    """Start `cmd` and SIGKILL it with every descendant (launcher, torchrun, ranks) as soon as the
    checkpoint of `at_step` is committed. Returns the step killed at."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while latest_step(run_dir) < at_step:
            if proc.poll() is not None:
                raise AssertionError(f"exited before step {at_step}: {proc.stderr.read()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint of step {at_step} within {timeout} s")
            time.sleep(0.01)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        proc.stderr.close()
    return latest_step(run_dir)
