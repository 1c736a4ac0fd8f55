"""`normlab quickstart` trains each named recipe, then ends with the compare report, two lines on
what to look at (with the data's unigram plateau) and the next command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.cli import main
from normlab.launch.commands.quickstart import DEFAULT
from normlab.launch.config import load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.study.unigram import dataset_unigram_loss, unigram_loss

from tests.conftest import tiny_overrides


def test_quickstart_trains_each_recipe_and_reports(
    tiny_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    over = [o for o in tiny_overrides(tiny_data, tmp_path) if not o.startswith("run_dir=")]
    out = tmp_path / "qs"
    argv = ["quickstart", "--recipes", "post_nowarmup,peri", "--steps", "4", "--out", str(out)]
    assert main([*argv, *over]) == 0
    text = capsys.readouterr().out
    md = (out / "report" / "compare.md").read_text()
    for name in ("post_nowarmup", "peri"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 4
        row = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
        assert f"{summary['final_loss']:.4f}" in row and f"{summary['eval_loss']:.4f}" in row
    for png in ("loss.png", "grad_norm.png", "resid_rms_by_depth.png", "max_logit.png"):
        assert (out / "report" / png).is_file() and f"]({png})" in md
    assert "normlab quickstart: 2 runs" in text  # trained side by side (--jobs 2 by default)
    plateau = dataset_unigram_loss(tiny_data)
    assert f"{plateau:.3f} is this data's unigram plateau" in text
    assert "Next: `normlab study lr12`" in " ".join(text.split())  # recipes/studies/lr12.yaml


def test_unigram_loss_by_hand() -> None:
    train = np.array([0, 0, 0, 1])  # p(0) = 3/4, p(1) = 1/4; token 2 unseen -> one count
    val = np.array([0, 1, 2])
    probs = np.array([3, 1, 1]) / 5
    expected = -(math.log(probs[0]) + math.log(probs[1]) + math.log(probs[2])) / 3
    assert unigram_loss(train, val, vocab_size=3) == pytest.approx(expected)


def test_default_recipes_are_the_measured_setting() -> None:
    cfgs = {Path(n).name: load_config(find_recipe(n)) for n in DEFAULT}
    assert {c.model.n_layers for c in cfgs.values()} == {12}
    assert {c.optim.lr for c in cfgs.values()} == {1e-3}
    assert {tuple(c.optim.betas) for c in cfgs.values()} == {(0.9, 0.999)}
    assert {c.training.steps for c in cfgs.values()} == {250}
    assert {c.training.eval_every for c in cfgs.values()} == {50}
    warm = {n: (c.model.placement, c.schedule.warmup_steps) for n, c in cfgs.items()}
    assert warm == {
        "post_nowarmup": ("post", 0),
        "post_warmup": ("post", 100),
        "pre_nowarmup": ("pre", 0),
        "deepnorm_warmup": ("deepnorm", 100),
    }


def test_bad_jobs_or_threads_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qs"
    assert main(["quickstart", "--jobs", "0", "--out", str(out)]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err
    assert main(["quickstart", "--threads", "-1", "--out", str(out)]) == 2
    assert "--threads must be >= 1, got -1" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "0"], "training.steps must be > 0, got 0"),
        (["--steps", "-3"], "training.steps must be > 0, got -3"),
        (["--recipes", ",,"], "--recipes names no recipe: ',,'"),
        (["--recipes", " "], "--recipes names no recipe"),
        (["--recipes", "pre,nope"], "no recipe file or recipe name 'nope'"),
    ],
)
def test_bad_steps_or_recipes_exit_2_on_one_line(
    args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qs"
    assert main(["quickstart", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err, err
    assert not out.exists()  # nothing trained, nothing written
