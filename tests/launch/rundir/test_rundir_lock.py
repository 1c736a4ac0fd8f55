"""One owner per run directory: a live owner (host and PID named) refuses a second trainer, a dead
one's lock (same host: PID gone or reused; other host: heartbeat older than the timeout) is taken
over, a launcher's ranks inherit its lock, and the lock goes when the owner ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.rundir import directory as rundir
from normlab.launch.rundir.directory import LOCK, TOKEN_ENV, RunDirBusy, RunDirLock, read_lock

from tests.conftest import REPO, tiny_overrides

HOLD = (
    "import sys, time; from launch.rundir.directory import RunDirLock\n"
    "with RunDirLock(sys.argv[1], 'holder'):\n    print('held', flush=True); time.sleep(60)\n"
)


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _fake_lock(run: Path, **fields: object) -> None:
    run.mkdir(parents=True, exist_ok=True)
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2026-01-01T00:00:00",
             "token": "t", "proc_start": None, "command": "normlab train"} | fields  # fmt: skip
    (run / LOCK).write_text(json.dumps(owner))


def test_second_trainer_on_a_live_run_dir_is_refused_naming_the_owner(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        capsys.readouterr()
        assert main(["train", "pre", *tiny_overrides(tiny_data, run)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert f"host {socket.gethostname()}, PID {holder.pid}" in err and "in use by" in err
        assert sorted(p.name for p in run.iterdir()) == [LOCK]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: same host, PID gone -> taken over, and the run trains
    assert main(["train", "pre", *tiny_overrides(tiny_data, run)]) == 0
    assert "took over the stale lock" in capsys.readouterr().err
    assert not (run / LOCK).exists()


def test_stale_rules_for_same_and_other_hosts(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "run"
    _fake_lock(run, proc_start="1")  # our own PID, but another process start time: reused
    with RunDirLock(run) as lock:
        assert read_lock(run) == lock.owner
    assert not (run / LOCK).exists()
    monkeypatch.setattr(rundir, "STALE_S", 120.0)
    _fake_lock(run, host="othernode", pid=1)
    with pytest.raises(RunDirBusy, match="host othernode, PID 1"):
        RunDirLock(run).acquire()  # heartbeat fresh: alive as far as we can tell
    old = time.time() - 121
    os.utime(run / LOCK, (old, old))
    with RunDirLock(run) as lock:
        assert lock.owner is not None and lock.owner.host == socket.gethostname()


def test_heartbeat_inheritance_and_release(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rundir, "HEARTBEAT_S", 0.05)
    run = tmp_path / "new"
    with RunDirLock(run) as lock:
        past = time.time() - 1000
        os.utime(run / LOCK, (past, past))
        time.sleep(0.3)
        assert time.time() - (run / LOCK).stat().st_mtime < 5  # refreshed
        assert lock.owner is not None
        monkeypatch.setenv(TOKEN_ENV, lock.owner.token)
        with RunDirLock(run) as child:  # a rank started by the launcher holding it
            assert child.owner is None
        assert (run / LOCK).exists()
    assert not run.exists()  # created for the lock, empty again: removed
