"""Issue 51 item 2: a normlab run's metrics written to TensorBoard (torchtitan's tags, with
SummaryWriter) and to JSONL (OLMo-core's keys) give the same spike scores and events E1-E3 as the
run itself, and as the instrument and events code compute them on the run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from normlab.launch.histories.load import HistoryOptions, as_run, read_history
from normlab.launch.histories.scores import history_events, spike_scores
from normlab.launch.instruments.spikes import RollingSpikeScore, run_window
from normlab.launch.rundir.runs import load_run
from normlab.launch.warning.events import run_events

from tests.launch.histories.conftest import write_jsonl, write_run, write_tensorboard

TITAN = {"loss": "loss_metrics/global_avg_loss", "grad_norm": "grad_norm", "lr": "lr/AdamW"}
OLMO = {"loss": "train/CE loss", "grad_norm": "optim/total grad norm", "lr": "optim/LR (group 0)"}


@pytest.fixture(scope="module")
def three(record: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("same_values")
    run_dir = write_run(record, root)
    rows = record["metrics"]
    # normlab's init_loss instrument (l_0 for E3) is logged by the others too, and named with
    # --metric init_loss=...: without it a history's l_0 is its first logged loss
    tb = write_tensorboard(rows, {**TITAN, "init_loss": "init/loss"}, root / "titan_tb")
    jsonl = write_jsonl(rows, {**OLMO, "init_loss": "train/init loss"}, root / "olmo.jsonl")
    return {
        "run_dir": run_dir,
        "tb": tb,
        "jsonl_path": jsonl,
        "normlab": read_history(run_dir),
        "tensorboard": read_history(
            tb, HistoryOptions(fp16=True, metrics={"init_loss": "init/loss"})
        ),
        "jsonl": read_history(
            jsonl, HistoryOptions(fp16=True, metrics={"init_loss": "train/init loss"})
        ),
        "init": next(r["init_loss"] for r in rows if "init_loss" in r),
    }


def test_the_sources_are_recognised(three: dict[str, Any]) -> None:
    assert three["tensorboard"].source == "torchtitan"
    assert three["jsonl"].source == "olmo-core"
    assert three["normlab"].source == "normlab" and three["normlab"].fp16


def test_the_three_hold_the_same_series(three: dict[str, Any]) -> None:
    ref = three["normlab"]
    for kind in ("tensorboard", "jsonl"):
        h = three[kind]
        for name in ("loss", "grad_norm", "lr"):
            assert h.series[name].steps == ref.series[name].steps, (kind, name)
            # TensorBoard stores float32: the run's float32 values come back exactly
            np.testing.assert_array_equal(
                np.float32(h.series[name].values), np.float32(ref.series[name].values)
            )
        assert h.warmup_steps == ref.warmup_steps == 5  # the lr's peak is the config's warm-up


@pytest.mark.parametrize("window,k", [(1000, 7.0), (20, 3.0)])  # OLMo 2's, and one that flags
def test_spike_scores_are_identical_and_match_the_instrument(
    three: dict[str, Any], window: int, k: float
) -> None:
    scores = {
        kind: spike_scores(three[kind], window, k) for kind in ("normlab", "tensorboard", "jsonl")
    }
    assert scores["normlab"] == scores["tensorboard"] == scores["jsonl"]
    # the instrument, fed the run's finite losses step by step, scores the same with that window
    ref = three["normlab"]
    for name, key in (("loss", "spike_loss"), ("grad_norm", "spike_grad")):
        values = [v for v in ref.series[name].values if math.isfinite(v)]
        rolling = RollingSpikeScore(window=scores["normlab"]["spike_window"], k=k)
        for v in values:
            rolling.update([v])
        assert scores["normlab"][key] == pytest.approx(rolling.score, abs=1e-12)
    n = sum(math.isfinite(v) for v in ref.loss.values)
    assert scores["normlab"]["spike_window"] == run_window(window, n)
    if window == 20:
        assert scores["normlab"]["spike_loss"] > 0  # the check is not one of zeros


def test_events_are_identical_and_match_the_run(three: dict[str, Any]) -> None:
    run = load_run(three["run_dir"])
    from_run = run_events(run.train + [{"step": 0, "init_loss": three["init"]}], run.config)
    recorded = [(e["kind"], e["step"]) for e in run.summary["events"]]
    assert [(e.kind, e.step) for e in from_run] == recorded  # the events code on the run
    normlab = history_events(three["normlab"])
    assert normlab == from_run
    assert history_events(three["tensorboard"]) == history_events(three["jsonl"]) == normlab
    assert three["tensorboard"].init_loss == pytest.approx(three["init"], rel=1e-7)
    assert {e.kind for e in normlab} == {"nonfinite", "return_to_init"}


def test_compare_reads_the_history_as_a_run(three: dict[str, Any], tmp_path: Path) -> None:
    from normlab.launch.report.compare import compare
    from rich.console import Console

    runs = [as_run(three["tensorboard"]), as_run(three["jsonl"])]
    result = compare(runs, None, console=Console(width=240, record=True))
    cards = result["cards"]
    scores = spike_scores(three["normlab"])
    for card in cards:
        assert card["spike_window"] == scores["spike_window"]
        assert card["spike_loss"] == scores["spike_loss"]
    assert [r["events"] for r in result["rows"]][0].startswith("E1 nonfinite@")


def test_the_compare_command_on_the_three(three: dict[str, Any], tmp_path: Path) -> None:
    """`normlab compare RUN TB JSONL --fp16 ...`: one table, the same events in each row."""
    import csv

    from normlab.launch.cli import main

    args = [str(three["run_dir"]), str(three["tb"]), str(three["jsonl_path"])]
    metric = ["--metric", "init_loss=init/loss"]
    assert main(["compare", *args[:2], "--fp16", *metric, "--out", str(tmp_path / "a")]) == 0
    rows = list(csv.DictReader((tmp_path / "a" / "compare.csv").open()))
    assert [r["events"] for r in rows] == [rows[0]["events"]] * 2
    assert rows[0]["events"] == "E1 nonfinite@161, E3 return_to_init@161"
    assert rows[1]["engine"] == "torchtitan (tensorboard)" and rows[1]["lr"] == ""
