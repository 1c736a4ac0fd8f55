"""compare's columns for FP8 training (launch/instruments/fp8.py): the last logged value of each
statistic, reduced over the converted layers or the blocks (the largest: FP8 breaks at its worst
layer), and the label of a run's FP8 switches."""

from __future__ import annotations

from typing import Any

from normlab.launch.metric_keys import (
    ELEMENT_KURTOSIS_RESID,
    ELEMENT_KURTOSIS_SWIGLU,
    FP8_IN_AMAX,
    FP8_OVER,
    FP8_UNDER,
)
from normlab.launch.rundir.runs import Run, last_logged

# key kind -> (column label, format); every column is the max over layers or blocks
FP8_COLUMNS = {
    FP8_UNDER: ("FP8 underflow", ".2e"),
    FP8_OVER: ("FP8 >448", ".2e"),
    FP8_IN_AMAX: ("FP8 input amax", ".3g"),
    ELEMENT_KURTOSIS_SWIGLU: ("kurtosis SwiGLU", ".1f"),
    ELEMENT_KURTOSIS_RESID: ("kurtosis resid", ".1f"),
}


def fp8_columns(run: Run) -> dict[str, Any]:
    """{kind: max over its keys, or None} from the last train row holding any of them."""
    return last_logged(run, FP8_COLUMNS, lambda key: key.split("/", 1)[0], lambda _, v: max(v))


def fp8_label(config: dict[str, Any]) -> str:
    """'+smooth_swiglu+fp8:rowwise' for a run's FP8 switches ('' for none)."""
    label = "+smooth_swiglu" if (config.get("model") or {}).get("smooth_swiglu") else ""
    fp8 = (config.get("precision") or {}).get("fp8")
    if isinstance(fp8, dict):
        label += f"+fp8:{fp8.get('recipe', 'tensorwise')}"
    return label
