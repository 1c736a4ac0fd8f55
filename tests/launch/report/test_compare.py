"""normlab compare on a real tiny run, a run still in progress (half-written last line, no
summary), a diverged run, and a directory that is not a run (clear error, exit 2)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.report.compare import compare
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer
from rich.console import Console

from tests.conftest import REPO, tiny_overrides
from tests.launch.instruments.test_spike_policy import Inject

INSTRUMENTS = [
    "instruments.activations=true",
    "instruments.gradients=true",
    "instruments.attention_logits=true",
    "instruments.spike_score.window=3",
]
PLOTS = {"loss.png", "grad_norm.png", "resid_rms_by_depth.png", "max_logit.png"}


@pytest.fixture(scope="module")
def finished(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "pre_run"
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    try:
        cfg = load_config(
            REPO / "recipes" / "pre.yaml", tiny_overrides(tiny_data, run) + INSTRUMENTS
        )
        assert Trainer(cfg).run() == 0
    finally:
        mp.undo()
    return run


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=250)  # noqa: SIM115


def test_table_values_follow_the_metrics(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    report = compare([finished], out, quiet())
    row = report["rows"][0]
    train = [r for r in read_jsonl(finished / "metrics.jsonl") if "loss" in r]
    evals = [r for r in read_jsonl(finished / "metrics.jsonl") if "eval_loss" in r]
    summary = json.loads((finished / "summary.json").read_text())
    grads = [r["grad_norm"] for r in train]
    assert row["run"] == "pre_run" and row["recipe"] == "pre" and row["placement"] == "pre"
    assert row["status"] == "completed" and row["steps"] == 8
    assert row["final_loss"] == train[-1]["loss"] and row["min_loss"] == summary["min_loss"]
    assert row["eval_loss"] == evals[-1]["eval_loss"]
    assert row["grad_max"] == max(grads)
    assert row["grad_p99"] == pytest.approx(np.percentile(grads, 99))
    assert row["act_growth"] == pytest.approx(train[-1]["resid_rms/01"] / train[-1]["resid_rms/00"])
    assert row["max_logit"] == max(r["max_logit"] for r in train)
    assert row["spike_loss"] == train[-1]["spike_score/loss"] and row["spike_window"] == 3
    assert row["scaler_skips"] == 0 and row["nonfinite"] == 0
    assert row["fp16_clamps"] is None and row["tokens_per_s"] == summary["tokens_per_s"]
    assert {p.name for p in out.iterdir()} == {"compare.md", "compare.csv", *PLOTS}
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "compare.md").read_text()
    assert "| run | recipe | placement |" in md and "| pre_run | pre | pre |" in md
    resid = [f"{train[-1][f'resid_rms/{i:02d}']:.3g}" for i in range(2)]
    assert f"| pre_run | 8 | {resid[0]} | {resid[1]} |" in md  # the depth table
    with (out / "compare.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert float(rows[0]["final_loss"]) == row["final_loss"] and rows[0]["fp16_clamps"] == ""


def test_run_in_progress(finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "running"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:40])  # mid-write
    row = compare([run], tmp_path / "out", quiet())["rows"][0]
    complete = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert row["status"] == "no summary" and row["steps"] == complete[-1]["step"]
    assert row["final_loss"] == complete[-1]["loss"]


def test_diverged_run(tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "diverged"
    cfg = load_config(REPO / "recipes" / "post_warmup.yaml", tiny_overrides(tiny_data, run))
    inject = Inject(nan_steps={5}, big_steps=set())
    assert Trainer(cfg, callbacks=[inject]).run() == 1
    row = compare([run], tmp_path / "out", quiet())["rows"][0]
    assert row["status"] == "diverged" and row["nonfinite"] == 1 and row["steps"] == 5
    assert row["placement"] == "post" and math.isfinite(row["grad_max"])
    assert (tmp_path / "out" / "loss.png").is_file()


def test_not_a_run_is_a_clear_error(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    assert main(["compare", str(finished), str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    want = f"normlab compare: error: {empty} is not a normlab run (no config.yaml)"
    assert err.startswith(want) and "Traceback" not in err
    assert not out.exists()  # nothing written when an argument is wrong
    assert main(["compare", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_cli_prints_the_table(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["compare", str(finished), "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "pre_run" in text and "act. growth" in text and "compare.md" in text


def test_growth_reads_the_stream_before_a_closing_norm(tmp_path: Path) -> None:
    """Post-norm blocks log their output (~1 by construction) and the sum before the norm; the
    growth column takes the sum there and the output elsewhere (a Mix-LN-like row: block 0 post,
    block 2 pre)."""
    from normlab.launch.report.table import summarize
    from normlab.launch.rundir.runs import Run

    row = {"step": 5, "loss": 4.0, "grad_norm": 1.0, "resid_rms/00": 1.0, "pre_norm_rms/00": 2.5}
    row |= {"resid_rms/01": 1.0, "pre_norm_rms/01": 4.0, "resid_rms/02": 7.5}
    run = Run(path=tmp_path, config={}, summary={}, train=[row])
    assert run.stream_rms(row) == [2.5, 4.0, 7.5]
    assert summarize(run)["act_growth"] == pytest.approx(7.5 / 2.5)
    post = {k: v for k, v in row.items() if k != "resid_rms/02"}
    assert summarize(Run(path=tmp_path, config={}, summary={}, train=[post]))[
        "act_growth"
    ] == pytest.approx(4.0 / 2.5)
