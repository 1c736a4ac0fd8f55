"""precision.fp8.small_gemms: skip leaves in high precision the layers torchao's auto filter
judges too small for FP8 to pay (its README's H100 tables: tensorwise loses at K <= 4096 with
N <= 1024; rowwise at N <= 2048, K <= 1024, or N <= 4096 with K <= 2048), and the preflight
check refuses a recipe whose filter leaves nothing in FP8."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.config import load_config
from normlab.launch.config.schema import FP8Section
from normlab.launch.engines.construct import build_on_meta
from normlab.launch.engines.fp8 import check_fp8, pays_in_fp8, section_targets
from normlab.launch.errors import ConfigError
from normlab.model import ModelConfig
from normlab.model.presets import PRESETS
from torch import nn

pytest.importorskip("torchao")
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("recipe", "k", "n", "pays"),
    [
        ("tensorwise", 2048, 1024, False),  # K <= 4096 and N <= 1024
        ("tensorwise", 4096, 1024, False),
        ("tensorwise", 2048, 2048, True),  # N above 1024
        ("tensorwise", 8192, 512, True),  # K above 4096
        ("tensorwise", 4104, 8192, False),  # 4104 is not a multiple of 16
        ("rowwise", 8192, 2048, False),  # N <= 2048
        ("rowwise", 1024, 8192, False),  # K <= 1024
        ("rowwise", 2048, 4096, False),  # N <= 4096 and K <= 2048
        ("rowwise", 2048, 8192, True),
        ("rowwise", 4096, 11008, True),  # the 7b preset's up projection
        ("rowwise_with_gw_hp", 2048, 4096, False),  # judged as rowwise
        ("rowwise_with_gw_hp", 4096, 4096, True),
    ],
)
def test_pays_in_fp8_follows_torchaos_tables(recipe: str, k: int, n: int, pays: bool) -> None:
    with_meta = nn.Linear(k, n, bias=False, device="meta")  # weight (N, K), as torchao reads it
    assert pays_in_fp8(with_meta, recipe) is pays


def _targets(preset: str, recipe: str, small_gemms: str) -> list[str]:
    model, _ = build_on_meta(ModelConfig(**{**PRESETS[preset], "n_layers": 1}))
    return section_targets(model, FP8Section(recipe=recipe, small_gemms=small_gemms))[0]


def test_skip_keeps_small_projections_of_the_125m_preset() -> None:
    every = _targets("125m", "tensorwise", "convert")
    assert len(every) == 7  # q, k, v, o, gate, up, down; the head kept by default
    # d 768: the 768 x 768 attention projections and the down projection (N 768) lose; the
    # gate and up projections (N 2048) stay in FP8
    kept = _targets("125m", "tensorwise", "skip")
    assert sorted(n.rsplit(".", 1)[-1] for n in kept) == ["gate_proj", "up_proj"]
    assert _targets("125m", "rowwise", "skip") == []  # N <= 2048 or N <= 4096 with K <= 2048


def test_skip_converts_every_layer_at_the_7b_width() -> None:
    for recipe in ("tensorwise", "rowwise"):
        assert _targets("7b", recipe, "skip") == _targets("7b", recipe, "convert")


def test_preflight_refuses_a_filter_that_leaves_nothing(tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "recipes" / "pre.yaml",
        ["precision.fp8={small_gemms: skip}", f"run_dir={tmp_path / 'r'}"],
    )
    with pytest.raises(ConfigError, match="small_gemms 'skip'.*nothing runs in FP8"):
        check_fp8(cfg, "cpu")
