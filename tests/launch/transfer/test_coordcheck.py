"""The coordinate check (SCIENCE.md 21.5) has power both ways: over an 8x width range sp fails and
µP passes; over 8x depth CompleteP passes; a deliberately broken µP multiplier fails; the command
writes its JSON and PNG and exits 1 naming what failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from normlab.launch.transfer import coordcheck as cc
from normlab.model import ModelConfig

BASE = dict(n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=128, max_seq_len=32)
# cheap: 1 seed, 6 steps, lr 3e-3 (measured margins: mup |s| <= 0.06 at t = 2 and 6, sp >= 1.2)
SETUP = dict(steps=6, seeds=1, lr=3e-3, batch=2, seq_len=16)
WIDTHS, DEPTHS = (64, 128, 256, 512), (2, 4, 8, 16)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _check(axis: str, sizes: tuple[int, ...], **kw) -> cc.CoordResult:
    return cc.coord_check(ModelConfig(**BASE, **kw), cc.CoordSetup(axis, sizes, **SETUP))


def test_sp_fails_over_8x_width_and_mup_passes() -> None:
    sp = _check("width", WIDTHS, init="normal")
    assert not sp.passed
    # the fail-positive control of 21.5: some class grows with slope >= 0.5 (SP: Δx ∝ width)
    assert max(sp.slope["mlp"][1], sp.slope["attn"][1]) >= 0.5
    mup = _check("width", WIDTHS, parametrization="mup", base_d_model=64)
    assert mup.passed, mup.failed
    assert all(abs(mup.slope[k][-1]) <= cc.SLOPE_LIMIT for k in mup.classes)


def test_completep_passes_over_8x_depth() -> None:
    res = _check("depth", DEPTHS, parametrization="completep", base_d_model=64, base_n_layers=2)
    assert res.passed, res.failed


def test_a_broken_output_multiplier_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """α_out instead of α_out / m_N on the head input (MuReadout without its 1/width_mult)."""
    import normlab.model.transformer as transformer

    right = transformer.output_mult
    monkeypatch.setattr(transformer, "output_mult", lambda cfg: right(cfg) * cfg.d_model / 64)
    res = _check("width", WIDTHS, parametrization="mup", base_d_model=64)
    assert any(line.startswith("logits at t=6") for line in res.failed), res.failed


def test_slope_is_the_log_log_least_squares_fit() -> None:
    assert cc.slope([64, 128, 256, 512], [3 * w**0.5 for w in (64, 128, 256, 512)]) == (
        pytest.approx(0.5)
    )


def test_command_writes_json_and_png_and_exits_1_naming_the_failure(tmp_path: Path) -> None:
    out = tmp_path / "cc"
    cmd = [
        sys.executable,
        "-m",
        "normlab.launch.cli",
        "coordcheck",
        "pre",
        "model.n_layers=1",
        "model.init=normal",
        "training.threads=1",
        "--widths",
        "64,512",
        "--steps",
        "2",
        "--seeds",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAIL" in proc.stdout and "at t=2: slope" in proc.stdout
    report = json.loads((out / "coordcheck.json").read_text())
    (check,) = report["checks"]
    assert check["passed"] is False and check["failed"]
    assert set(check["classes"]) == set(cc.WIDTH_CLASSES)
    assert (out / check["png"]).stat().st_size > 0
