"""`plan` with precision.fp8: the working-set terms of launch/engines/memory.fp8_working, counted
by hand for a small model, and the table's header."""

from __future__ import annotations

from dataclasses import replace

from normlab.launch.config import load_config
from normlab.launch.engines.memory import Layout, estimate, fp8_working
from normlab.launch.engines.memory_plan import plan_report
from normlab.model import ModelConfig

from tests.conftest import REPO

CFG = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=128)
MATRICES = 2 * (4 * 64 * 64 + 3 * 64 * 128)  # q, k, v, o and gate, up, down of 2 blocks


def test_fp8_working_set_by_hand() -> None:
    lay = Layout("single", batch=2, seq_len=16, dtype="bf16", fp8="tensorwise")
    tokens, wide = 32, 128
    transient = 2 * 64 * 128 + 2 * tokens * wide + 2 * (4 * 2)  # casts + 4 tensorwise scales
    assert fp8_working(CFG, lay) == transient - MATRICES * 2  # no autocast bf16 weight copies
    assert fp8_working(CFG, replace(lay, dtype="fp32")) == transient  # fp32: only the casts
    rowwise = replace(lay, dtype="fp32", fp8="rowwise")
    assert fp8_working(CFG, rowwise) == transient - 16 + 2 * 4 * (tokens + wide)
    fsdp = replace(lay, engine="fsdp", world=2, dtype="fp32")
    assert fp8_working(CFG, fsdp) == transient - 2 * (MATRICES / 2) * 3  # 1-byte gathered blocks
    assert fp8_working(CFG, replace(fsdp, fp8_gather=False)) == transient
    assert fp8_working(CFG, replace(lay, fp8=None)) == 0.0
    plain = estimate(CFG, replace(lay, fp8=None))
    assert estimate(CFG, lay).working == plain.working + fp8_working(CFG, lay)


def test_plan_names_fp8() -> None:
    cfg = load_config(REPO / "recipes" / "presets" / "1b.yaml", ["precision.fp8={}"])
    lines = plan_report(cfg, 1, 8, "141GB")
    assert "+ fp8 tensorwise" in lines[0]
    assert any(line.startswith("deepspeed zero_stage=3") for line in lines)
    assert lines[-1].startswith("verdict: fits")
