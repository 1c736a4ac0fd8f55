"""Exact resume: N steps straight vs k steps, SIGKILL of the real process, resume to N.

Per-step losses (log_every 1) must be bit-identical on CPU: the checkpoint carries the model,
optimizer, schedule position, loader position and the python/numpy/torch RNG states.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.rundir.metrics import read_jsonl

from tests.conftest import REPO, tiny_overrides

STEPS, EVERY = 40, 5


def _cmd(data: Path, run_dir: Path) -> list[str]:
    over = tiny_overrides(
        data,
        run_dir,
        training__steps=STEPS,
        checkpoint__every=EVERY,
        training__eval_every=10,
        model__dropout=0.1,  # dropout draws from the torch RNG: resume must restore it
    )
    return [sys.executable, "-m", "normlab.launch.cli", "train", "recipes/pre.yaml", *over]


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "NORMLAB_CACHE": str(tmp / "cache"), "PYTHONPATH": str(REPO)}


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


def _kill_after_first_checkpoint(cmd: list[str], run_dir: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not latest.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"run ended before its first checkpoint: {proc.stderr.read().decode()}")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_then_resume_gives_identical_losses(tiny_data: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(_cmd(tiny_data, straight), cwd=REPO, env=env, check=True, capture_output=True)

    _kill_after_first_checkpoint(_cmd(tiny_data, killed), killed, env)
    saved = (killed / "checkpoints" / "latest").read_text().strip()
    assert int(saved.split("_")[1]) < STEPS, "the kill must land before the run finished"
    done = subprocess.run(_cmd(tiny_data, killed), cwd=REPO, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert "resuming" in done.stdout.decode()

    want, got = _losses(straight), _losses(killed)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == want  # exact float equality, step by step
