"""Checkpoints for week-long jobs: the recipe's optimizer values win on resume (moments kept), a
manifest catches flipped bytes and names the file and the previous verified checkpoint, a run
killed after its final checkpoint is completed by the next invocation, and a full disk mid-save
is one line that leaves the previous checkpoint intact and resumable exactly."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import pytest
import torch
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.schedule import build_schedule, lr_change
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"
NEW = {"optim.lr": 5e-4, "optim.betas": (0.8, 0.9), "optim.eps": 1e-7, "optim.weight_decay": 0.05}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def _over(data: Path, run: Path, **kw: object) -> list[str]:
    return tiny_overrides(data, run, **kw)


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def _rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def test_changed_optimizer_values_apply_on_resume_with_moments_kept(
    tiny_data: Path, tmp_path: Path
) -> None:
    base = ["optim.lr=1e-3"]  # warmup 2 steps: the tiny overrides
    runs = {name: tmp_path / name for name in ("same", "changed")}
    for run in runs.values():  # 4 steps, checkpoint at 4
        assert main(["train", str(PRE), *_over(tiny_data, run, training__steps=4), *base]) == 0
    moments = torch.load(runs["changed"] / "checkpoints/step_00000004/optim.pt")["state"]
    new = [f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in NEW.items()]
    cfg = load_config(PRE, [*_over(tiny_data, runs["changed"]), *base, *new])
    trainer = Trainer(cfg, force=True)
    assert trainer.run() == 0
    assert main(["train", str(PRE), *_over(tiny_data, runs["same"]), *base, "--force"]) == 0

    groups = {g["group"]: g for g in trainer.engine.optimizer.param_groups}
    for g in groups.values():
        assert g["lr_mult"] == 1.0 and g["betas"] == (0.8, 0.9) and g["eps"] == 1e-7
    assert groups["decay"]["weight_decay"] == 0.05 and groups["no_decay"]["weight_decay"] == 0.0
    # the logged lr follows the new recipe: 5e-4 x the schedule's multiplier at steps 5..8
    lr_at = build_schedule(cfg.schedule, cfg.training.steps, cfg.model_config().d_model)
    rows = _rows(runs["changed"])
    for step in range(5, 9):
        assert rows[step]["lr"] == pytest.approx(5e-4 * lr_at(step), rel=1e-12)
    same, changed = _losses(runs["same"]), _losses(runs["changed"])
    assert [same[s] for s in range(1, 5)] == [changed[s] for s in range(1, 5)]
    assert all(same[s] != changed[s] for s in range(6, 9))  # step 5's loss precedes its update
    # moments come from the checkpoint: reload step 4 into a fresh engine and compare exactly
    fresh = Trainer(cfg, force=True)
    fresh._build()
    fresh.ckpt.load(fresh.engine, "step_00000004")
    state = fresh.engine.optimizer.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg"], moments[i]["exp_avg"]) for i in moments)
    assert not any("lr" in c.partition(":")[0] for c in fresh.ckpt.recipe_changes)  # no copy held
    saved = torch.load(runs["changed"] / "checkpoints/step_00000004/trainer.pt", weights_only=False)
    line = lr_change(saved["config"], cfg, 4)  # the one place a new optim.lr is reported
    assert line is not None and "optim.lr 0.001 -> 0.0005" in line
    # an unchanged recipe reports nothing: the scheduled `lr` of the saved step is no change
    same_cfg = load_config(PRE, [*_over(tiny_data, runs["same"]), *base])
    again = Trainer(same_cfg)
    again._build()
    again.ckpt.load(again.engine, "step_00000004")
    assert again.ckpt.recipe_changes == []


def _flip(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("victim", ["model.pt", "optim.pt"])
def test_flipped_bytes_are_named_and_the_previous_checkpoint_resumes_exactly(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], victim: str
) -> None:
    run, straight = tmp_path / "run", tmp_path / "straight"
    for r in (run, straight):
        assert main(["train", str(PRE), *_over(tiny_data, r)]) == 0  # checkpoints at 4 and 8
    ckpt = run / "checkpoints" / "step_00000008"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name, entry in manifest["files"].items():  # sizes and sha256 by hand
        data = (ckpt / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _flip(ckpt / victim)
    capsys.readouterr()
    assert main(["train", str(PRE), *_over(tiny_data, run, training__steps=12), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"{ckpt / victim} is corrupt" in err and "--from step_00000004" in err
    again = ["train", str(PRE), *_over(tiny_data, run), "--from", "step_00000004"]
    assert main(again) == 0
    assert _losses(run) == _losses(straight)  # steps 5..8 retrained bit-identically
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000008"
    assert main(["train", str(PRE), *_over(tiny_data, run)]) == 0  # the new step 8 verifies


def test_run_killed_after_its_final_checkpoint_is_completed_next_time(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    over = [*_over(tiny_data, run), "checkpoint.keep_last=1"]
    assert main(["train", str(PRE), *over]) == 0
    done = json.loads((run / "summary.json").read_text())
    # what a kill between the final save and the summary leaves: 'running', an unpruned step
    (run / "summary.json").write_text(json.dumps(done | {"status": "running"}))
    ckpts = run / "checkpoints"
    (ckpts / "step_00000004").mkdir()
    (ckpts / "step_00000004" / "model.pt").write_bytes(b"old")
    capsys.readouterr()
    assert main(["train", str(PRE), *over]) == 0
    assert "marked completed" in capsys.readouterr().out
    repaired = json.loads((run / "summary.json").read_text())
    assert repaired["status"] == "completed" and repaired["steps"] == 8
    assert repaired["final_loss"] == done["final_loss"]
    assert repaired["eval_loss"] == done["eval_loss"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000008"]


def test_full_disk_mid_save_is_one_line_and_resumes_exactly(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import normlab.launch.engines.single as single

    run, straight = tmp_path / "run", tmp_path / "straight"
    over = _over(tiny_data, run, training__steps=12)
    assert main(["train", str(PRE), *_over(tiny_data, straight, training__steps=12)]) == 0
    real_save, calls = torch.save, []

    def save(obj: object, path: Path) -> None:  # the second checkpoint's optim.pt hits ENOSPC
        calls.append(Path(path))
        if len(calls) == 6:
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(obj, path)

    monkeypatch.setattr(single.torch, "save", save)
    capsys.readouterr()
    assert main(["train", str(PRE), *over]) == 2
    err = capsys.readouterr().err.strip()
    tmp = run / "checkpoints" / ".tmp-step_00000008"
    assert err.count("\n") == 0 and f"no space left on device while writing {tmp}/optim.pt" in err
    assert not tmp.exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    monkeypatch.setattr(single.torch, "save", real_save)
    assert main(["train", str(PRE), *over]) == 0
    assert _losses(run) == _losses(straight)
