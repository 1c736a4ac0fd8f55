"""MuonClip configuration: the recipes validate and can join a study; bad tau/alpha, Muon on an
engine setting that cannot run it (ZeRO offload) and QK-Clip without per-head logits fail on one
line with exit 2; Muon on every ZeRO stage validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.errors import ConfigError

from tests.conftest import REPO

PRE = REPO / "recipes" / "pre.yaml"
CLIP = "optim.qk_clip={tau: 100.0, alpha: 0.5}"


def test_recipes_select_muon_and_qk_clip() -> None:
    pre = load_config(REPO / "recipes" / "muonclip.yaml")
    olmo = load_config(REPO / "recipes" / "olmo2_muonclip.yaml")
    for cfg in (pre, olmo):
        assert cfg.optim.name == "muon" and cfg.optim.muon_scale == "match_rms_adamw"
        assert cfg.optim.qk_clip is not None
        assert (cfg.optim.qk_clip.tau, cfg.optim.qk_clip.alpha) == (100.0, 0.5)  # Kimi K2
        assert cfg.optim.lr == load_config(PRE).optim.lr  # the AdamW lr carries over
    assert (pre.model.placement, pre.model_config().qk_norm) == ("pre", "none")
    assert (olmo.model.placement, olmo.model.qk_norm) == ("olmo2", "flat")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["optim.qk_clip={tau: 0.0}"], "optim.qk_clip.tau must be a finite number > 0, got 0.0"),
        (["optim.qk_clip={tau: -5}"], "optim.qk_clip.tau must be a finite number > 0"),
        (["optim.qk_clip={tau: .inf}"], "optim.qk_clip.tau must be a finite number"),
        (["optim.qk_clip={tau: .nan}"], "optim.qk_clip.tau must be a finite number"),
        (["optim.qk_clip={alpha: 1.5}"], "optim.qk_clip.alpha must lie in [0, 1], got 1.5"),
        (["optim.qk_clip={alpha: -0.1}"], "optim.qk_clip.alpha must lie in [0, 1]"),
        (["optim.qk_clip={alpha: .nan}"], "optim.qk_clip.alpha must"),
        (["optim.qk_clip={taux: 3}"], "unknown key 'optim.qk_clip.taux' (did you mean"),
        (["optim.qk_clip={tau: high}"], "optim.qk_clip.tau must be a number"),
        (["optim.qk_clip=true"], "optim.qk_clip must be a mapping"),
        (["optim.muon_scale=rms"], "optim.muon_scale must be one of 'match_rms_adamw', 'original'"),
        (["optim.muon_momentum=1.0"], "optim.muon_momentum must lie in [0, 1)"),
        (["optim.muon_ns_dtype=fp16"], "optim.muon_ns_dtype must be one of 'bf16', 'fp32'"),
        (["optim.name=muonn"], "did you mean 'muon'?"),
    ],
)
def test_bad_muonclip_settings_fail_on_one_line(
    overrides: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="optim"):
        load_config(PRE, overrides)
    assert main(["validate", str(PRE), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err, err


@pytest.mark.parametrize("offload", ["offload_optimizer", "offload_param"])
def test_muon_with_zero_offload_is_refused_on_one_line(
    offload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {offload: {"device": "cpu"}}}))
    zero = ["engine.name=deepspeed", "engine.zero_stage=3", f"engine.deepspeed_config={user}"]
    assert main(["validate", str(PRE), "optim.name=muon", *zero]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"cannot run with zero_optimization.{offload}" in err, err
    assert main(["validate", str(PRE), *zero]) == 0  # AdamW may offload


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_muon_on_every_zero_stage_validates(stage: int) -> None:
    zero = ["engine.name=deepspeed", f"engine.zero_stage={stage}"]
    assert main(["validate", str(PRE), "optim.name=muon", CLIP, *zero]) == 0


@pytest.mark.parametrize("accum", ["fp32", "float32", "torch.float32"])
def test_muon_under_deepspeeds_bf16_optimizer_is_refused_on_one_line(
    accum: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ZeRO-1 + bf16 + fp32 gradient accumulation makes DeepSpeed pick BF16_Optimizer, whose
    partitions Muon cannot reassemble: refused by validate, before any engine is built."""
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"data_types": {"grad_accum_dtype": accum}}))
    base = [
        str(PRE),
        "precision.dtype=bf16",
        "engine.name=deepspeed",
        f"engine.deepspeed_config={user}",
    ]
    assert main(["validate", *base, "optim.name=muon", "engine.zero_stage=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "BF16_Optimizer" in err and "zero_stage 2" in err, err
    assert main(["validate", *base, "optim.name=muon", "engine.zero_stage=2"]) == 0
    assert main(["validate", *base, "engine.zero_stage=1"]) == 0  # AdamW runs there
