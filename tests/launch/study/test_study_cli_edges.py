"""`normlab study` at its edges (issue 30, item 8): an empty `--lrs ''` is refused (it used to
run one run at the recipe's rate), `--submit` without sbatch advises only what exists (study has
no --dry-run), and a study stopped by Ctrl-C exits 130 like `train` and `launch` and prints the
command that resumes it, which runs as printed (issue 47, item 4) from another directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cli import main

from tests.conftest import tiny_overrides
from tests.dist_helpers import env


def _sets(tiny_data: Path, **extra: object) -> list[str]:
    over = tiny_overrides(tiny_data, Path("unused"), **extra)
    return [f"--set={o}" for o in over if not o.startswith("run_dir=")]


@pytest.mark.parametrize("flag", ["--lrs", "--seeds"])
@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_list_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_data: Path, flag: str, value: str
) -> None:
    out = tmp_path / "study"
    code = main(["study", "pre", flag, value, "--out", str(out), *_sets(tiny_data)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and flag in err, err
    assert not out.exists()


def test_submit_without_sbatch_advises_what_study_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tiny_data: Path,
) -> None:  # fmt: skip
    import argparse

    from normlab.launch.commands import study as study_cmd

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch anywhere
    out = tmp_path / "study"
    args = ["study", "pre", "--lrs", "1e-3", "--seeds", "0", "--submit", "--gpus-per-node", "0"]
    args += ["--out", str(out)]
    code = main([*args, *_sets(tiny_data)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "sbatch is not installed" in err, err
    assert "add --dry-run to this command" in err and "drop --submit" in err, err
    # every flag the line offers is one study has
    parser = argparse.ArgumentParser()
    study_cmd.register(parser.add_subparsers())
    study_flags = set(parser._subparsers._group_actions[0].choices["study"]._option_string_actions)
    assert set(re.findall(r"--[a-z][a-z-]*", err)) <= study_flags, err
    assert not out.exists()
    # each advice runs as printed: the same command with --dry-run prints every run's script
    # and writes nothing; without --submit it is a plain study (tests/launch/study trains those)
    assert main([*args, *_sets(tiny_data), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("# ---- pre: ") == 1 and "#SBATCH" in shown and 'launch "$RUN_DIR"' in shown
    assert "1 of 1 runs would be submitted" in shown and not out.exists()
    without = [a for a in args if a != "--submit"]
    assert main([*without, *_sets(tiny_data), "--dry-run"]) == 2
    assert "give it with --submit" in capsys.readouterr().err


def test_ctrl_c_exits_130(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "normlab.launch.cli", "study", "pre", "--lrs", "1e-3",
           "--seeds", "0,1", "--out", str(out),
           *_sets(tiny_data, training__steps=60, checkpoint__every=60)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not any(p.stat().st_size for p in out.glob("**/metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 130, (stdout + stderr).decode()[-2000:]
    assert b"study stopped after" in stdout
    summaries = [json.loads(p.read_text()) for p in out.glob("**/summary.json")]
    assert summaries and {s["status"] for s in summaries} == {"interrupted"}
    found = re.search(r"resume with `([^`]+)`", stdout.decode())
    assert found, stdout.decode()[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    again = subprocess.run(shlex.split(found.group(1)), env={**env(), "PATH": path},
                           cwd=elsewhere, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    summaries = [json.loads(p.read_text()) for p in out.glob("**/summary.json")]
    assert len(summaries) == 2 and {s["status"] for s in summaries} == {"completed"}
