"""A changed schedule on resume is printed with the lr before and after at the resume step; WSD
extends a finished run without a jump (the stable phase extends, the decay re-plans), resumed from
the checkpoint the trainer keeps at the end of its stable phase."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from normlab.launch.config import RunConfig, ScheduleSection, load_config
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.schedule import build_schedule, lr_change, stable_end
from normlab.launch.training.trainer import Trainer
from rich.console import Console

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"


def _cfg(**sections: object) -> RunConfig:
    over = [f"{k.replace('__', '.')}={v}" for k, v in sections.items()]
    return load_config(PRE, over)


def test_cosine_extension_prints_the_jump() -> None:
    """The issue's numbers: cosine to 0.1 x 1e-3, warm-up 100, 300 steps extended to 400: at step
    300 the lr was 1.0e-4 and the new plan gives 1e-3 (0.1 + 0.9 * 0.5 (1 + cos(2 pi / 3)))."""
    cosine = {"schedule__kind": "cosine", "schedule__warmup_steps": 100, "optim__lr": 1e-3}
    old = _cfg(**cosine, schedule__min_lr_ratio=0.1, training__steps=300).to_dict()
    new = _cfg(**cosine, schedule__min_lr_ratio=0.1, training__steps=400)
    line = lr_change(old, new, 300)
    assert line is not None
    assert "cosine over 300 steps -> cosine over 400" in line
    assert "lr at step 300 0.0001 -> 0.000325" in line and "a jump of x3.25" in line
    nxt = 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 201 / 300)))
    assert f"step 301 takes {nxt:.4g}" in line and "schedule.kind=wsd" in line


def test_wsd_extension_from_the_stable_phase_is_continuous() -> None:
    wsd = {"schedule__kind": "wsd", "schedule__warmup_steps": 2, "schedule__decay_fraction": 0.25}
    old, new = _cfg(**wsd, training__steps=20), _cfg(**wsd, training__steps=40)
    assert stable_end(old.schedule, 20) == 15 and stable_end(new.schedule, 40) == 30
    line = lr_change(old.to_dict(), new, 15)
    assert line is not None and line.endswith("(continuous)")
    assert f"lr at step 15 {old.optim.lr:.4g} -> {old.optim.lr:.4g}" in line
    # from the final (decayed) checkpoint the same extension is a jump back to the peak
    floor = old.optim.lr * old.schedule.min_lr_ratio
    jump = lr_change(old.to_dict(), new, 20)
    assert jump is not None and f"lr at step 20 {floor:.4g} -> {old.optim.lr:.4g}" in jump
    assert "a jump of x10" in jump


def test_unchanged_plan_prints_nothing() -> None:
    cfg = _cfg(schedule__kind="cosine", schedule__warmup_steps=10, training__steps=300)
    assert lr_change(cfg.to_dict(), cfg, 120) is None
    assert lr_change({}, cfg, 120) is None  # a saved config without the sections
    assert stable_end(ScheduleSection(kind="cosine"), 300) is None


@pytest.fixture(scope="module")
def runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A WSD run of 8 steps extended to 16 from its stable-phase checkpoint (step 6), and a run
    planned for 16 steps from the start (decay_fraction 0.25: stable through step 12)."""
    root = tmp_path_factory.mktemp("wsd")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NORMLAB_CACHE", str(root / "cache"))
        return _extend_and_plan(tiny_data, root)


def _extend_and_plan(tiny_data: Path, root: Path) -> dict[str, object]:
    quiet = Console(record=True, width=300)
    ext, ref = root / "extended", root / "planned"
    base = dict(
        schedule__kind="wsd",
        schedule__decay_fraction=0.25,
        training__eval_every=0,
        checkpoint__every=4,
        checkpoint__keep_last=1,
    )
    short = load_config(PRE, tiny_overrides(tiny_data, ext, training__steps=8, **base))
    assert Trainer(short, console=quiet).run() == 0
    kept = sorted(p.name for p in (ext / "checkpoints").iterdir() if p.name.startswith("step_"))
    longer = load_config(PRE, tiny_overrides(tiny_data, ext, training__steps=16, **base))
    console = Console(record=True, width=300)
    trainer = Trainer(longer, force=True, from_step="step_00000006", console=console)
    assert trainer.run() == 0
    planned = load_config(PRE, tiny_overrides(tiny_data, ref, training__steps=16, **base))
    assert Trainer(planned, console=quiet).run() == 0
    return {"kept": kept, "text": console.export_text(), "ext": ext, "ref": ref, "cfg": longer}


def _rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def test_wsd_keeps_the_checkpoint_at_the_end_of_its_stable_phase(runs: dict) -> None:
    assert runs["kept"] == ["step_00000006", "step_00000008"]  # keep_last 1 + the pinned one


def test_wsd_extension_prints_a_continuous_lr(runs: dict) -> None:
    assert "resuming" in runs["text"] and "from step_00000006" in runs["text"]
    assert "wsd over 8 steps -> wsd over 16" in runs["text"] and "(continuous)" in runs["text"]


def test_wsd_extension_follows_the_longer_plan_exactly(runs: dict) -> None:
    """The extended run's lr at every step is the 16-step plan's (peak through step 12, then
    linear to the floor at 16), and on CPU its losses are bit-identical to the planned run's."""
    cfg = runs["cfg"]
    ext, ref = _rows(runs["ext"]), _rows(runs["ref"])
    assert sorted(ext) == list(range(1, 17))
    plan = build_schedule(cfg.schedule, 16, cfg.model_config().d_model)
    lr, floor = cfg.optim.lr, cfg.schedule.min_lr_ratio
    for step in range(1, 17):
        assert ext[step]["lr"] == pytest.approx(lr * plan(step), rel=1e-12)
    assert ext[6]["lr"] == ext[7]["lr"] == ext[12]["lr"] == lr  # no jump at the resume step
    for step in range(13, 17):
        assert ext[step]["lr"] == pytest.approx(lr * (floor + (1 - floor) * (16 - step) / 4))
    assert [ext[s]["loss"] for s in range(1, 17)] == [ref[s]["loss"] for s in range(1, 17)]
