"""W&B set-up failures are one line, exit 2, before the run directory is created; config.yaml and
summary.json reach the W&B run as files (issue 30, item 5). Offline mode only (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides

pytest.importorskip("wandb")

OFFLINE = "logging.wandb={mode: offline, project: normlab-test}"


def train(tiny_data: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "pre", *tiny_overrides(tiny_data, run, training__steps=4), *extra]


def one_line_refusal(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    from normlab.launch.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("normlab train: error: "), err
    return err


def test_a_wandb_that_fails_to_import_is_one_line(tiny_data: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('cannot import name Message (protobuf)')")
    run = tmp_path / "run"
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "normlab.launch.cli", *train(tiny_data, run, OFFLINE)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert err.count("\n") == 0 and "the installed wandb does not import" in err, err
    assert "ImportError: cannot import name Message (protobuf)" in err
    assert not run.exists()


@pytest.mark.parametrize("mode", ["garbage", "Offline"])
def test_a_wandb_mode_w_and_b_refuses_is_one_line(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, mode: str
) -> None:
    monkeypatch.setenv("WANDB_MODE", mode)
    err = one_line_refusal(capsys, train(tiny_data, tmp_path / "run", OFFLINE))
    assert f"W&B refuses WANDB_MODE={mode!r}" in err
    assert not (tmp_path / "run").exists()


def test_online_without_credentials_is_one_line(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for var in ("WANDB_API_KEY", "WANDB_MODE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text("machine example.org login x password y\n")
    err = one_line_refusal(capsys, train(tiny_data, tmp_path / "run", "logging.wandb={}"))
    assert "needs W&B credentials" in err and f"api.wandb.ai in {tmp_path / '.netrc'}" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "a list, not a mapping"),
        ('{"run_id": "../../x", "last_step": 3}', "run_id '../../x' is no W&B run id"),
        ('{"last_step": 3}', "run_id None is no W&B run id"),
        ('{"run_id": "ab12cd34", "last_step": -1}', "last_step -1 is not a step number"),
        ('{"run_id": "ab12cd34", "last_step": "7"}', "last_step '7' is not a step number"),
        ("\udcff", "damaged W&B state"),
    ],
)
def test_a_damaged_wandb_json_is_refused_by_name(
    tiny_data: Path, tmp_path: Path, capsys, text: str, problem: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    state = run / "wandb.json"
    state.write_bytes(text.encode("utf-8", "surrogateescape"))
    err = one_line_refusal(capsys, train(tiny_data, run, OFFLINE))
    assert f"{state}: damaged W&B state" in err and problem in err, err
    assert "delete it to start a new W&B run" in err
    assert sorted(p.name for p in run.iterdir()) == ["wandb.json"]  # nothing else written


def test_read_state_of_a_sound_file(tmp_path: Path) -> None:
    from normlab.launch.rundir.wandb_setup import read_state

    assert read_state(tmp_path / "wandb.json") == {}
    (tmp_path / "wandb.json").write_text('{"run_id": "ab12cd34", "last_step": 12}\n')
    assert read_state(tmp_path / "wandb.json") == {"run_id": "ab12cd34", "last_step": 12}


def test_config_and_summary_are_uploaded_as_files(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from normlab.launch.cli import main

    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = tmp_path / "run"
    assert main(train(tiny_data, run, OFFLINE)) == 0
    (files,) = (run / "wandb").glob("offline-run-*/files")
    for name in ("config.yaml", "summary.json"):
        assert (files / name).read_bytes() == (run / name).read_bytes(), name
    summary = json.loads((files / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4


def test_validate_checks_all_but_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from normlab.launch.cli import main

    for var in ("WANDB_API_KEY", "WANDB_MODE", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["validate", "pre", "--quiet", "logging.wandb={}", f"run_dir={tmp_path / 'run'}"]
    assert main(argv) == 0  # online without a key here: the job may hold its own
    assert "pre: valid;" in capsys.readouterr().out
    monkeypatch.setenv("WANDB_MODE", "garbage")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "W&B refuses WANDB_MODE='garbage'" in err
