"""`normlab export` onto a disk that fills up (issue 30, item 8): one line, exit 2, nothing left
behind, never safetensors' own traceback.

safetensors reports a failed write as `SafetensorError('Error while serializing: I/O error: No
space left on device (os error 28)')`, not an OSError. Tested two ways: that exception as
safetensors raises it (ENOSPC cannot be made on demand here), and a real failed write: the
export process runs under RLIMIT_FSIZE, so the weights file cannot grow past 20 kB (EFBIG, os
error 27, raised by safetensors' own writer)."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from normlab.launch.cli import main

from tests.conftest import tiny_overrides
from tests.dist_helpers import env


@pytest.fixture(scope="module")
def run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe
    from normlab.launch.training.trainer import Trainer

    run = tmp_path_factory.mktemp("export_full") / "run"
    over = tiny_overrides(tiny_data, run, training__steps=2, checkpoint__every=2)
    assert Trainer(load_config(find_recipe("pre"), [*over, "training.eval_every=0"])).run() == 0
    return run


def _left(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if out.name in p.name)


def test_no_space_left_is_one_line(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "exported"
    assert main(["export", str(run), "--out", str(out), "--no-hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no space left on device while writing" in err, err
    assert _left(out) == []  # neither the export nor its temporary folder


def test_a_write_that_fails_for_real_is_one_line(run: Path, tmp_path: Path) -> None:
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "exported"
    proc = subprocess.run(
        [sys.executable, "-m", "normlab.launch.cli", "export", str(run), "--out", str(out),
         "--no-hf"],
        env={**env(), "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True,
        timeout=300, preexec_fn=limited,
    )  # fmt: skip
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.count("\n") == 0, err[-2000:]
    assert "cannot write" in err and "File too large" in err and "Traceback" not in err, err
    assert _left(out) == []
