"""instruments.fp8: the cast statistics against hand-computed e4m3 numbers and the keys a training
run logs (log steps only); its kurtosis against the formulas in test_kurtosis.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from normlab.launch.config import load_config
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

pytest.importorskip("torchao")
from normlab.launch.instruments.fp8 import FP8Stats, cast_stats  # noqa: E402
from torchao.float8 import Float8LinearConfig  # noqa: E402


def test_cast_stats_of_a_known_tensor() -> None:
    cast = Float8LinearConfig().cast_config_input  # tensorwise e4m3
    x = torch.tensor([[1.0, 1e-6, 0.0, -2000.0]])
    amax, scale, under, over, n = cast_stats(x, cast, -1, pow2=False).tolist()
    assert amax == 2000.0
    assert scale == pytest.approx(448.0 / 2000.0)  # torchao: e4m3 max / amax
    # 1e-6 * 0.224 is below half of e4m3's smallest subnormal (2^-9): cast to zero; 0 is no
    # underflow; -2000 lies beyond 448 at unit scale
    assert (under, over, n) == (1.0, 1.0, 4.0)


def test_rowwise_scales_are_per_row_powers_of_two() -> None:
    cast = Float8LinearConfig.from_recipe_name("rowwise").cast_config_input
    x = torch.tensor([[3.0, 1.0], [0.5, 0.25]])
    _, scale, *_ = cast_stats(x, cast, -1, pow2=True).tolist()
    assert scale == 128.0  # row 0: 448 / 3 = 149.3 rounded down to 2^7 (the smaller scale)


def test_training_logs_every_layer_and_kurtosis_on_log_steps(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    over = tiny_overrides(tiny_data, tmp_path / "run", training__log_every=2, training__steps=4)
    over += ["precision.fp8={}", "instruments.fp8=true"]
    trainer = Trainer(load_config(REPO / "recipes" / "pre.yaml", over))
    assert trainer.run() == 0
    fp8 = next(cb for cb in trainer.callbacks if isinstance(cb, FP8Stats))
    assert fp8._handles == []  # removed at the end; armed only before log steps
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [2, 4]
    for row in rows:
        for sub in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            for i in (0, 1):
                assert row[f"fp8_in_amax/{i:02d}/{sub}"] > 0
                scale = row[f"fp8_in_scale/{i:02d}/{sub}"]
                assert scale == pytest.approx(448.0 / row[f"fp8_in_amax/{i:02d}/{sub}"], rel=1e-6)
        assert 0 <= row["fp8_under"] < 0.01 and row["fp8_over"] == 0.0
        for i in (0, 1):
            for site in ("swiglu", "resid"):  # both estimators are at least 1 (their minimum)
                assert row[f"kurtosis_{site}/{i:02d}"] > 1.0
                assert row[f"neuron_kurtosis_{site}/{i:02d}"] >= 1.0
    assert not any(k.endswith("/head") for k in rows[0])  # the head stays out


def test_compare_shows_the_worst_layer_and_the_fp8_label() -> None:
    from normlab.launch.report.fp8_columns import fp8_columns, fp8_label
    from normlab.launch.rundir.runs import Run

    rows = [
        {"step": 1, "loss": 5.0, "fp8_under": 0.5},
        {"step": 2, "loss": 4.0, "fp8_under": 0.01, "fp8_in_amax/00/q_proj": 2.0},
        {"step": 2, "loss": 4.0, "fp8_under": 0.02, "fp8_in_amax/01/down_proj": 7.0},
    ]
    run = Run(path=Path("r"), config={}, train=rows[1:2], evals=[], summary={})
    assert fp8_columns(run)["fp8_in_amax"] == 2.0 and fp8_columns(run)["fp8_under"] == 0.01
    run.train = [{**rows[1], **rows[2]}]
    assert fp8_columns(run)["fp8_in_amax"] == 7.0
    cfg = {"model": {"smooth_swiglu": True}, "precision": {"fp8": {"recipe": "rowwise"}}}
    assert fp8_label(cfg) == "+smooth_swiglu+fp8:rowwise" and fp8_label({}) == ""
