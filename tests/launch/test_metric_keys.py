"""Metric names typed once (issue 48 item 3): the keys launch.metric_keys names are imported where
they are written and read, not retyped as strings elsewhere in the package, and the per-block key
format round-trips."""

from __future__ import annotations

import ast
from pathlib import Path

from normlab.launch import metric_keys as mk

LAUNCH = Path(__file__).resolve().parents[2] / "launch"

# names no other part of the package uses for anything else (an instrument's or a signal's own
# name, a checkpoint state key, a config field): a string equal to one of them is the metric
ONLY_METRICS = (
    mk.FP8_IN_UNDER, mk.FP8_W_UNDER, mk.FP8_IN_OVER, mk.FP8_W_OVER, mk.FP8_IN_AMAX, mk.FP8_W_AMAX,
    mk.FP8_IN_SCALE, mk.FP8_W_SCALE, mk.FP8_UNDER, mk.FP8_OVER, mk.ELEMENT_KURTOSIS_SWIGLU,
    mk.ELEMENT_KURTOSIS_RESID, mk.LOGZ_MIN, mk.LOGZ_MAX, mk.LOGIT_MEAN, mk.GRAD_RMS, mk.ACT_GROWTH,
    mk.Z_LOSS, mk.ATTN_OUT, mk.MLP_OUT, mk.PRE_NORM, mk.UPDATE_RATIO_MAX,
    mk.SPIKE_LOSS, mk.SPIKE_GRAD, mk.SPIKE_WINDOW, mk.S_MAX, mk.CLIP_EVENTS,
)  # fmt: skip


def retyped(path: Path, names: set[str], root: Path = LAUNCH.parent) -> list[str]:
    """'file:line "name"' for each string literal in `path` equal to one of `names` (docstrings
    and f-strings' text are not literals equal to a whole name, so they do not count)."""
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_metric_names_are_not_retyped_outside_metric_keys() -> None:
    names = set(ONLY_METRICS)
    assert len(names) == len(ONLY_METRICS)  # no two constants share a name
    found = [
        hit
        for path in sorted(LAUNCH.rglob("*.py"))
        if path.name != "metric_keys.py"
        for hit in retyped(path, names)
    ]
    assert found == [], "import these from launch.metric_keys: " + ", ".join(found)


def test_the_check_finds_a_retyped_name(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text('"""fp8_under in a docstring."""\nKEY = "fp8_under"\n')
    assert retyped(tmp_path / "x.py", {mk.FP8_UNDER}, tmp_path) == ["x.py:2 'fp8_under'"]


def test_block_keys_round_trip() -> None:
    key = mk.block_key(mk.FP8_IN_UNDER, 3, "attn.q_proj")
    assert key == "fp8_in_under/03/attn.q_proj"
    assert mk.block_key(mk.ELEMENT_KURTOSIS_RESID, 11) == "kurtosis_resid/11"
    assert mk.parse_block_key("kurtosis_resid/11") == (mk.ELEMENT_KURTOSIS_RESID, 11, None)
    keys = ["kurtosis_resid/10", "kurtosis_resid/02", "kurtosis_resid/02/x", "kurtosis_swiglu/00"]
    assert mk.block_keys(mk.ELEMENT_KURTOSIS_RESID, keys) == [
        "kurtosis_resid/02",
        "kurtosis_resid/10",
    ]
