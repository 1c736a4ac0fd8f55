"""The spike report card of `normlab compare`: hand-written metrics.jsonl files whose card is
worked out by hand, and a short real run with a skipped step and every spike instrument on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from normlab.launch.config import load_config
from normlab.launch.report.card import report_card
from normlab.launch.report.compare import compare
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.rundir.runs import load_run
from normlab.launch.training.trainer import Trainer
from rich.console import Console

from tests.conftest import REPO, tiny_overrides
from tests.launch.instruments.test_spike_policy import Inject


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=250)  # noqa: SIM115


def write_run(path: Path, rows: list[dict], steps: int) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: synth\ntraining:\n  steps: {steps}\n")
    (path / "summary.json").write_text(json.dumps({"status": "completed", "steps": steps}))
    with (path / "metrics.jsonl").open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def test_card_of_hand_written_metrics(tmp_path: Path) -> None:
    first = {"step": 10, "loss": 5.0, "grad_norm": 1.0, "skipped_steps": 1, "rollbacks": 0}
    last = {
        "step": 40,
        "loss": 4.0,
        "grad_norm": 1.0,
        "spike_score/loss": 2.5,
        "spike_score/grad_norm": 5.0,
        "spike_score/window": 20,
        "update_spike_steps": 3,
        "update_spikes/00": 1,
        "update_ratio_max/00": 4.5,
        "update_spikes/01": 2,
        "update_ratio_max/01": 7.25,
        "update_norm/00": 0.01,
        "skipped_steps": 4,
        "rollbacks": 1,
        "rolled_back_steps": 2,
        "fp16_clamps": 7,
        "scaler_skips": 3,
        "nonfinite_steps": 1,
    }
    run = load_run(write_run(tmp_path / "a", [first, last], 40))
    card = report_card(run, 40)
    assert card["update_spikes_by_block"] == "b0 1 (x4.5), b1 2 (x7.25)"
    assert card["update_threshold"] == "x4"  # the instrument's default: the config names none
    assert card["lost_pct"] == pytest.approx(100 * (4 + 2) / 40)  # 15 %
    assert (card["spike_loss"], card["spike_grad"], card["spike_window"]) == (2.5, 5.0, 20)
    assert (card["fp16_clamps"], card["scaler_skips"], card["nonfinite"]) == (7, 3, 1)
    assert (card["skipped"], card["rollbacks"], card["rolled_back"]) == (4, 1, 2)


def test_unmeasured_is_a_dash_not_zero(tmp_path: Path) -> None:
    bare = load_run(write_run(tmp_path / "bare", [{"step": 5, "loss": 4.0, "grad_norm": 1.0}], 5))
    card = report_card(bare, 5)
    assert all(card[k] is None for k in card if k not in ("run", "steps"))
    policy = [{"step": 5, "loss": 4.0, "grad_norm": 1.0, "skipped_steps": 1, "rollbacks": 0}]
    card = report_card(load_run(write_run(tmp_path / "p", policy, 5)), 5)
    assert card["rolled_back"] == 0 and card["lost_pct"] == pytest.approx(20.0)
    rolled = [{"step": 5, "loss": 4.0, "grad_norm": 1.0, "skipped_steps": 1, "rollbacks": 1}]
    card = report_card(load_run(write_run(tmp_path / "r", rolled, 5)), 5)  # count not logged
    assert card["rolled_back"] is None and card["lost_pct"] is None
    out = tmp_path / "report"
    compare([tmp_path / "bare"], out, quiet())
    md = (out / "compare.md").read_text()
    assert "## Spike report card" in md
    line = next(x for x in md.splitlines() if x.startswith("| bare | 5 |"))
    assert line.count("| - ") == 13


@pytest.fixture(scope="module")
def spiky(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 steps, NaN gradients at step 6 (skipped by the policy), every spike instrument on."""
    run = tmp_path_factory.mktemp("card") / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    try:
        overrides = tiny_overrides(
            tiny_data, run, training__steps=12, training__log_every=4, checkpoint__every=0
        ) + [
            "instruments.spike_score.window=3",
            "instruments.update_spikes.window=3",
            "instruments.update_spikes.threshold=1.5",
            "instruments.spike_policy.window=3",
        ]
        cfg = load_config(REPO / "recipes" / "pre.yaml", overrides)
        trainer = Trainer(cfg, callbacks=[Inject(nan_steps={6}, big_steps=set())], console=quiet())
        assert trainer.run() == 0
    finally:
        mp.undo()
    return run


def test_card_of_a_real_run(spiky: Path, tmp_path: Path) -> None:
    report = compare([spiky], tmp_path / "report", quiet())
    card = report["cards"][0]
    rows = [r for r in read_jsonl(spiky / "metrics.jsonl") if "loss" in r]
    last = rows[-1]
    assert [r["step"] for r in rows] == [4, 8, 12]
    assert card["skipped"] == 1 and card["rolled_back"] == 0
    assert card["lost_pct"] == pytest.approx(100 / 12)
    assert card["nonfinite"] == last["nonfinite_steps"] == 1  # the NaN step, counted apart
    assert card["update_spike_steps"] == last["update_spike_steps"]
    assert card["update_threshold"] == "x1.5"
    blocks = [f"b{i} {int(last[f'update_spikes/{i:02d}'])}" for i in range(2)]
    assert [part.split(" (")[0] for part in card["update_spikes_by_block"].split(", ")] == blocks
    assert all(last[f"update_norm/{i:02d}"] > 0 for i in range(2))  # step 12 was applied
    assert "## Spike report card" in (tmp_path / "report" / "compare.md").read_text()


def test_rolled_back_steps_of_a_real_rollback(tiny_data: Path, tmp_path: Path) -> None:
    """Steps 1-4 applied, checkpoint at 3, NaN at 5-8 (skipped; the 4th rolls back to step 3,
    discarding step 4), a 1e6x spike at 9 (skipped), step 10 applied: 5 skipped + 1 rolled
    back = 6 of 10 steps lost."""
    from tests.launch.instruments.test_spike_policy import _trainer

    inject = Inject(nan_steps={5, 6, 7, 8}, big_steps={9})
    trainer, _ = _trainer(tiny_data, tmp_path / "run", inject, checkpoint__every=3)
    assert trainer.run() == 0
    rows = {r["step"]: r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert [rows[s]["rolled_back_steps"] for s in range(1, 11)] == [0] * 7 + [1, 1, 1]
    card = compare([tmp_path / "run"], None, quiet())["cards"][0]
    assert (card["skipped"], card["rollbacks"], card["rolled_back"]) == (5, 1, 1)
    assert card["lost_pct"] == pytest.approx(60.0)
