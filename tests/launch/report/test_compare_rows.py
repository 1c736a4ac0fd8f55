"""compare shows the optimizer, the engine and the global batch of each run, and warns when the
runs trained on different tokenizers or datasets (their losses are then not comparable)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import yaml
from normlab.launch.report.compare import compare
from normlab.launch.report.provenance import dataset_id, tokenizer_id
from rich.console import Console

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def run1(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from normlab.launch.cli import main

    run = tmp_path_factory.mktemp("rows") / "run1"
    over = tiny_overrides(tiny_data, run, training__grad_accum=2, optim__qk_clip="{tau: 50.0}")
    assert main(["train", "pre", *over]) == 0
    return run


def _variant(run1: Path, tmp_path: Path, name: str, **sections: dict) -> Path:
    run = tmp_path / name
    shutil.copytree(run1, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    for section, values in sections.items():
        cfg[section] = {**cfg[section], **values}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def _compare(*runs: Path) -> dict:
    return compare(list(runs), None, Console(width=400, file=io.StringIO()))


def test_rows_show_optimizer_engine_and_global_batch(run1: Path) -> None:
    (row,) = _compare(run1)["rows"]
    summary = json.loads((run1 / "summary.json").read_text())
    assert summary["tokens_per_step"] == 4 * 64 * 2  # batch 4 x seq 64 x grad_accum 2, 1 process
    assert row["global_batch"] == 4 * 2
    assert row["optimizer"] == "adamw+qk_clip" and row["engine"] == "single"


def test_deepspeed_and_fsdp_engines_are_labelled(run1: Path, tmp_path: Path) -> None:
    ds = _variant(run1, tmp_path, "ds", engine={"name": "deepspeed", "zero_stage": 3})
    hsdp = _variant(run1, tmp_path, "hsdp", engine={"name": "fsdp", "replicate": 2})
    rows = _compare(ds, hsdp)["rows"]
    assert [r["engine"] for r in rows] == ["deepspeed zero-3", "fsdp x2 replicas"]


def test_the_same_data_and_tokenizer_give_no_warning(run1: Path, tmp_path: Path) -> None:
    again = _variant(run1, tmp_path, "again", optim={"lr": 1.0e-3})
    assert _compare(run1, again)["warnings"] == []


def test_different_datasets_and_tokenizers_are_warned_about(run1: Path, tmp_path: Path) -> None:
    bundled = _variant(run1, tmp_path, "bundled", data={"dataset": "bundled"})
    warnings = _compare(run1, bundled)["warnings"]
    assert len(warnings) == 2
    assert "different tokenizers" in warnings[0] and "run1: bpe/512 " in warnings[0]
    assert "bundled: bpe/512" in warnings[0]
    assert "different datasets" in warnings[1] and "bundled: bundled (val" in warnings[1]


def test_a_prepared_copy_counts_as_the_same_data(run1: Path, tmp_path: Path) -> None:
    cfg = yaml.safe_load((run1 / "config.yaml").read_text())
    copy = tmp_path / "prepared_copy"
    shutil.copytree(cfg["data"]["dataset"], copy)
    moved = _variant(run1, tmp_path, "moved", data={"dataset": str(copy)})
    assert dataset_id(cfg) == dataset_id(yaml.safe_load((moved / "config.yaml").read_text()))
    assert tokenizer_id(cfg).startswith("bpe/512 ")
    assert _compare(run1, moved)["warnings"] == []
