"""engine.compile with precision.fp8 (and Smooth-SwiGLU, and the fp8 instrument armed on log
steps): no graph break, no recompilation, the eager run's losses (dynamo's `eager` backend, as
tests/launch/engines/test_compile.py checks every placement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.engines.test_compile import check, train

pytest.importorskip("torchao")


@pytest.mark.parametrize(
    "recipe", ["tensorwise", pytest.param("rowwise", marks=pytest.mark.slow)]
)  # CI: tensorwise; `-m slow`: rowwise (the same conversion with axiswise scales)
def test_fp8_compiles_without_breaks(tiny_data: Path, tmp_path: Path, recipe: str) -> None:
    extra = {
        "precision.fp8": f"{{recipe: {recipe}}}",
        "model.smooth_swiglu": True,
        "instruments.fp8": True,
    }
    eager = train(tiny_data, tmp_path / "eager", "pre", None, **extra)
    compiled = train(tiny_data, tmp_path / "compiled", "pre", "eager", **extra)
    check(eager, compiled, rtol=1e-6)
    assert "fp8_in_amax/00/down_proj" in compiled["rows"][-1]
