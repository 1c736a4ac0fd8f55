"""Every file in recipes/ loads and validates; large presets are counted on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from normlab.launch.commands.validate import count_model
from normlab.launch.config import load_config
from normlab.model import Transformer, count_params

from tests.conftest import REPO

# recipes/clusters holds cluster files for `normlab submit` and recipes/studies study files (their
# own test: tests/launch/study/test_study_file.py), not recipes
RECIPES = sorted(
    p for p in (REPO / "recipes").rglob("*.yaml") if not {"clusters", "studies"} & set(p.parts)
)
SCHEMES = {
    "post_warmup": "post",
    "post_nowarmup": "post",
    "pre": "pre",
    "pre_nowarmup": "pre",
    "peri": "peri",
    "olmo2": "olmo2",
    "deepnorm": "deepnorm",
    "mix": "mix",
    "ln_scaling": "ln_scaling",
    "pre_qknorm_head": "pre",
    "pre_qknorm_flat": "pre",
}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_recipe_validates(path: Path) -> None:
    cfg = load_config(path)
    total, _ = count_model(cfg)
    assert total == count_params(cfg.model_config())


def test_one_recipe_per_scheme() -> None:
    for name, placement in SCHEMES.items():
        cfg = load_config(REPO / "recipes" / f"{name}.yaml")
        assert cfg.model.placement == placement, name
        assert cfg.model.preset == "tiny"
    assert load_config(REPO / "recipes/post_warmup.yaml").schedule.warmup_steps > 0
    assert load_config(REPO / "recipes/post_nowarmup.yaml").schedule.warmup_steps == 0
    assert load_config(REPO / "recipes/ln_scaling.yaml").model_config().ln_scaling is True
    axes = {
        load_config(REPO / f"recipes/pre_qknorm_{a}.yaml").model.qk_norm for a in ("head", "flat")
    }
    assert axes == {"head", "flat"}


def test_paper_defaults_of_peri_and_ln_scaling() -> None:
    """Peri-LN normalises the embedding as its paper does (switchable); LayerNorm Scaling runs
    on plain N(0, 0.02) init, since depth-scaled init cancels its benefit (SCIENCE.md 2)."""
    peri = Transformer(load_config(REPO / "recipes" / "peri.yaml").model_config())
    assert isinstance(peri.embed_norm, torch.nn.Module) and peri.config.embed_norm
    tokens = torch.randint(0, peri.config.vocab_size, (2, 8))
    raw = peri.embed(tokens)
    expected = torch.nn.functional.rms_norm(raw, (raw.shape[-1],), eps=peri.config.norm_eps)
    torch.testing.assert_close(peri.embed_norm(raw), expected)  # unit gain at init
    off = load_config(REPO / "recipes" / "peri.yaml", ["model.embed_norm=false"]).model_config()
    assert isinstance(Transformer(off).embed_norm, torch.nn.Identity)
    lns = load_config(REPO / "recipes" / "ln_scaling.yaml").model_config()
    assert lns.init == "normal" and load_config(REPO / "recipes" / "pre.yaml").model.init is None


def test_7b_parameter_count_without_allocating() -> None:
    cfg = load_config(REPO / "recipes" / "presets" / "7b.yaml")
    mc = cfg.model_config()
    with torch.device("meta"):
        model = Transformer(mc)
    assert all(p.device.type == "meta" for p in model.parameters())
    # Llama-2-7B shapes: per block 4 d^2 (attention) + 3 d d_ff (SwiGLU) + 2 d (RMSNorm gains),
    # untied embedding and head, one final norm.
    d, f, L, V = 4096, 11008, 32, 32000
    analytic = L * (4 * d * d + 3 * d * f + 2 * d) + 2 * V * d + d
    assert analytic == 6_738_415_616
    assert count_model(cfg)[0] == analytic


def test_presets_report_their_size() -> None:
    sizes = {
        p: count_model(load_config(REPO / f"recipes/presets/{p}.yaml"))[0]
        for p in ("125m", "350m", "1b")
    }
    assert 100e6 < sizes["125m"] < 150e6
    assert 300e6 < sizes["350m"] < 400e6
    assert 1.0e9 < sizes["1b"] < 1.4e9
