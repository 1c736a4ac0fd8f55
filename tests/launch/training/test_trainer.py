"""Trainer: metrics files, schedule applied, grad accumulation, precisions, non-finite stop,
run-directory rules (refusal, --force, corrupt checkpoints leave the directory untouched)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from normlab.launch.callbacks import Callback
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.schedule import build_schedule
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

PRE, PERI = REPO / "recipes" / "pre.yaml", REPO / "recipes" / "peri.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def _train(data: Path, run_dir: Path, recipe: Path = PRE, cbs: list | None = None, **kw: object):
    trainer = Trainer(load_config(recipe, tiny_overrides(data, run_dir, **kw)), callbacks=cbs)
    return trainer, trainer.run()


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_run_writes_metrics_summary_config_and_tensorboard(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer, status = _train(tiny_data, run, logging__tensorboard=True, optim__lr=0.01)
    assert status == 0
    rows = read_jsonl(run / "metrics.jsonl")
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert [r["step"] for r in rows if "eval_loss" in r] == [4, 8]
    for r in train:
        assert {"loss", "lr", "grad_norm", "tokens_per_s", "step_time"} <= r.keys()
    cfg = trainer.cfg
    sched = build_schedule(cfg.schedule, 8, cfg.model_config().d_model)
    assert [r["lr"] for r in train] == pytest.approx([0.01 * sched(s) for s in range(1, 9)])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 8
    assert summary["final_loss"] == pytest.approx(train[-1]["loss"])
    assert summary["min_loss"] == pytest.approx(min(r["loss"] for r in train))
    assert train[-1]["loss"] < train[0]["loss"]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert load_config(run / "config.yaml").to_dict() == cfg.to_dict()
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_00000008"
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"latest", "step_00000004", latest}


def test_keep_last_prunes_old_checkpoints(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(tiny_data, run, checkpoint__every=2, checkpoint__keep_last=2)
    names = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert names == ["step_00000006", "step_00000008"]


def test_grad_accumulation_matches_the_larger_batch(tiny_data: Path, tmp_path: Path) -> None:
    _train(tiny_data, tmp_path / "a", data__batch_size=8, training__steps=3)
    _train(tiny_data, tmp_path / "b", data__batch_size=4, training__grad_accum=2, training__steps=3)
    loss = [
        [r["loss"] for r in read_jsonl(tmp_path / d / "metrics.jsonl") if "loss" in r]
        for d in ("a", "b")
    ]
    assert loss[0] == pytest.approx(loss[1], rel=1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mixed_precision_trains(tiny_data: Path, tmp_path: Path, dtype: str) -> None:
    trainer, status = _train(tiny_data, tmp_path / dtype, precision__dtype=dtype, training__steps=4)
    assert status == 0 and math.isfinite(trainer.summary["final_loss"])


class _PoisonWeights(Callback):
    """Sets one weight to inf after the backward of `step`: the next forward's loss is NaN."""

    name = "poison"

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer: Trainer, step: int) -> None:
        if step == self.step:
            with torch.no_grad():
                trainer.engine.model.embed.weight.fill_(math.inf)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(
    tiny_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    trainer, status = _train(tiny_data, run, cbs=[_PoisonWeights(5)])
    assert status == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_step"] == 6
    assert summary["events"] == [{"kind": "nonfinite", "step": 6}]  # SCIENCE.md 23.1 E1
    from normlab.launch.commands.status import format_status, run_status
    from normlab.launch.report.table import summarize
    from normlab.launch.rundir.runs import load_run

    assert "events (SCIENCE.md 23.1): E1 nonfinite@6" in format_status(run_status(run))
    assert summarize(load_run(run))["events"] == "E1 nonfinite@6"
    assert "non-finite loss" in summary["message"] and "step_00000004" in summary["message"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000004"]
    weights = torch.load(run / "checkpoints/step_00000004/model.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_huge_learning_rate_diverges_via_cli(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    over = tiny_overrides(tiny_data, run, optim__lr=1e12, optim__grad_clip=0.0, training__steps=30)
    assert main(["train", str(PRE), *over]) == 1
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


def test_other_recipe_refused_without_force(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["train", str(PRE), *tiny_overrides(tiny_data, run)]) == 0
    before = _snapshot(run)
    assert main(["train", str(PERI), *tiny_overrides(tiny_data, run)]) == 2
    err = capsys.readouterr().err
    assert "holds a run with a different config" in err and "--force" in err
    assert _snapshot(run) == before
    # --force with another architecture: the checkpoint cannot be loaded; nothing is touched
    assert main(["train", str(PERI), *tiny_overrides(tiny_data, run), "--force"]) == 2
    assert "does not match the configured architecture" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_force_continues_with_more_steps(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", str(PRE), *tiny_overrides(tiny_data, run)]) == 0
    longer = tiny_overrides(tiny_data, run, training__steps=12)
    assert main(["train", str(PRE), *longer]) == 2
    assert main(["train", str(PRE), *longer, "--force"]) == 0
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 13))
    assert (run / "config.previous.yaml").is_file()
    # the same command again: already trained, nothing changes
    before = _snapshot(run)
    assert main(["train", str(run)]) == 0
    assert _snapshot(run) == before


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing", "bad_pointer"])
def test_damaged_checkpoint_is_a_clear_error(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    run = tmp_path / "run"
    assert main(["train", str(PRE), *tiny_overrides(tiny_data, run, training__steps=4)]) == 0
    ckpt = run / "checkpoints" / "step_00000004"
    if damage == "truncate":
        data = (ckpt / "model.pt").read_bytes()
        (ckpt / "model.pt").write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        (ckpt / "trainer.pt").write_bytes(b"not a checkpoint")
    elif damage == "missing":
        (ckpt / "optim.pt").unlink()
    else:
        (run / "checkpoints" / "latest").write_text("step_00000099\n")
    before = _snapshot(run)
    capsys.readouterr()
    assert main(["train", str(PRE), *tiny_overrides(tiny_data, run, training__steps=4)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "checkpoint" in err
    assert {
        "truncate": "truncated or corrupt",
        "garbage": "truncated or corrupt",
        "missing": "missing",
        "bad_pointer": "not a checkpoint directory",
    }[damage] in err
    assert _snapshot(run) == before


def test_non_run_directory_is_refused(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "precious"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert main(["train", str(PRE), *tiny_overrides(tiny_data, run)]) == 2
    assert [p.name for p in run.iterdir()] == ["notes.txt"]


class _Interrupt(Callback):
    name = "interrupt"

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict) -> None:
        if step == 3:
            raise KeyboardInterrupt


def test_restart_before_first_checkpoint_logs_each_step_once(
    tiny_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_data, run, cbs=[_Interrupt()])
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert _train(tiny_data, run)[1] == 0
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 9))


def test_eval_before_the_first_log_step(tiny_data: Path, tmp_path: Path) -> None:
    """eval_every 2, log_every 3: step 2 evaluates before any loss is logged (no crash)."""
    run = tmp_path / "run"
    _, status = _train(
        tiny_data, run, training__steps=3, training__eval_every=2, training__log_every=3
    )
    assert status == 0
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval_loss" in r] == [2, 3]
    assert [r["step"] for r in rows if "loss" in r] == [3]
