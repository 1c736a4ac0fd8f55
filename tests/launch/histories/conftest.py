"""One committed normlab run (docs/warnings/divergence: fp16, diverged, E1 and E3 both found)
unpacked as a run directory, and writers for the same values in other trainers' formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

BUNDLE = REPO / "docs" / "warnings" / "divergence" / "runs.jsonl.gz"
RUN = "pre_fp16_noclamp_lr0.05_s1"  # 160 logged steps, E1 and E3 at 161


def committed_run() -> dict[str, Any]:
    with gzip.open(BUNDLE, "rt") as fh:
        for line in fh:
            record = json.loads(line)
            if record["name"] == RUN:
                return record
    raise LookupError(RUN)


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return committed_run()


def write_run(record: dict[str, Any], root: Path) -> Path:
    d = root / record["name"]
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(record["config"], sort_keys=False))
    (d / "summary.json").write_text(json.dumps(record["summary"]))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in record["metrics"]))
    return d


def number(v: Any) -> float:
    return float(v)  # metrics.jsonl spells non-finite values 'nan'/'inf'


def write_tensorboard(rows: list[dict[str, Any]], names: dict[str, str], out: Path) -> Path:
    """The rows' metrics under `names` (normlab key -> tag) with torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out))
    for row in rows:
        for key, tag in names.items():
            if key in row:
                writer.add_scalar(tag, number(row[key]), int(row["step"]))
    writer.close()
    return out


def write_jsonl(rows: list[dict[str, Any]], names: dict[str, str], path: Path) -> Path:
    """One JSON line per row with a `step` and the metrics under `names` (json.dumps writes a
    non-finite float as NaN/Infinity, as Python trainers' JSONL loggers do)."""
    with path.open("w") as fh:
        for row in rows:
            out = {tag: number(row[key]) for key, tag in names.items() if key in row}
            if out:
                fh.write(json.dumps({"step": int(row["step"]), **out}) + "\n")
    return path
