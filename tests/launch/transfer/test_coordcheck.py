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


# the depth checks committed in docs/coordcheck/ and quoted in docs/transfer.md: name -> argv
DOCS = Path(__file__).resolve().parents[3] / "docs"
COMPLETEP = ["model.parametrization=completep", "model.base_d_model=128", "model.base_n_layers=2"]
COMMITTED = {
    "pre_sp": ["pre", "model.init=normal"],
    "pre_completep": ["pre", *COMPLETEP],
    "peri_completep": ["peri", *COMPLETEP],
    "olmo2_completep": ["olmo2", *COMPLETEP],
}


def _committed(name: str) -> dict:
    (check,) = json.loads((DOCS / "coordcheck" / name / "coordcheck.json").read_text())["checks"]
    return check


def test_transfer_page_quotes_the_committed_depth_checks() -> None:
    """docs/transfer.md's table: each committed check's verdict and its slopes at t = 10 (the
    last block's output; for the output-norm placements also its change since t = 1)."""
    text = (DOCS / "transfer.md").read_text()
    rows = {
        "pre_sp": ("Pre-LN", "sp", None),
        "pre_completep": ("Pre-LN", "completep", None),
        "peri_completep": ("Peri-LN", "completep", "its change since t = 1: "),
        "olmo2_completep": ("OLMo 2", "completep", ""),
    }
    for name, (placement, param, change) in rows.items():
        check = _committed(name)
        assert (check["axis"], check["sizes"], check["steps"]) == ("depth", [2, 4, 8, 16], 10)
        assert (check["seeds"], check["lr"]) == (3, 0.01)
        last, delta = (
            f"{check['classes'][k]['slope'][-1]:+.2f}".replace("-", "\u2212")
            for k in ("last_layer", "last_layer_delta")
        )
        cell = last if change is None else f"{last} ({change}{delta})"
        verdict = "pass" if check["passed"] else "fail"
        assert f"| {placement} | {param} | {cell} | {verdict} |" in text, name
    assert not _committed("pre_completep")["passed"] and _committed("peri_completep")["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_depth_check_is_what_the_command_gives(name: str, tmp_path: Path) -> None:
    """The command run again (about 30 s each on 2 cores): the same slopes and verdict."""
    out = tmp_path / name
    argv = [*COMMITTED[name], "--depths", "2,4,8,16", "--out", str(out)]
    cmd = [sys.executable, "-m", "normlab.launch.cli", "coordcheck", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (check,) = json.loads((out / "coordcheck.json").read_text())["checks"]
    committed = _committed(name)
    assert proc.returncode == (0 if committed["passed"] else 1), proc.stderr[-2000:]
    assert check["passed"] == committed["passed"] and check["failed"] == committed["failed"]
    for cls, values in committed["classes"].items():
        assert check["classes"][cls]["slope"] == pytest.approx(values["slope"], abs=1e-3), cls
