"""`normlab warnings` on JSONL histories scores the loss and the grad norm exactly as on the same
runs as normlab run directories (the committed divergence sweep's lr 0.05 seeds, both logging
only step, loss, grad norm, lr and l_0)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from normlab.launch.cli import main

from tests.launch.histories.conftest import BUNDLE

KEEP = ("step", "loss", "grad_norm", "lr", "init_loss")


def sweep(prefix: str) -> list[dict[str, Any]]:
    with gzip.open(BUNDLE, "rt") as fh:
        return [r for r in map(json.loads, fh) if r["name"].startswith(prefix)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("warn")
    runs, histories = root / "runs", root / "histories"
    histories.mkdir()
    for r in sweep("pre_fp16_noclamp_lr0.05_"):
        rows = [{k: v for k, v in m.items() if k in KEEP} for m in r["metrics"]]
        text = "".join(json.dumps(m) + "\n" for m in rows if len(m) > 1)
        d = runs / r["name"]
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump(r["config"]))
        (d / "summary.json").write_text(json.dumps(r["summary"]))  # its recorded events
        (d / "metrics.jsonl").write_text(text)
        (histories / f"{r['name']}.jsonl").write_text(text)
    return runs, histories


def test_the_same_scores(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    runs, histories = dirs
    assert main(["warnings", str(runs), "--out", str(tmp_path / "a")]) == 0
    assert (
        main(["warnings", str(histories), "--fp16", "--steps", "400", "--out", str(tmp_path / "b")])
        == 0
    )
    a = json.loads((tmp_path / "a" / "warnings.json").read_text())
    b = json.loads((tmp_path / "b" / "warnings.json").read_text())
    assert [r["signal"] for r in a["signals"]] == [r["signal"] for r in b["signals"]]
    assert {r["signal"] for r in a["signals"]} == {"loss", "grad_norm"}
    assert a["signals"] == b["signals"] and a["conclusion"] == b["conclusion"]
    assert len(b["tuning_runs"]) == 2 and len(b["held_out_runs"]) == 4  # seeds from the names
