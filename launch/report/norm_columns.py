"""compare's columns for the norm-side stabilizers (launch/instruments/norm_stabilizers.py): the
last logged value of each statistic, averaged over every block, sub-layer and the final layer."""

from __future__ import annotations

from typing import Any

import numpy as np
from normlab.launch.rundir.runs import Run, last_logged

# key kind -> (column label, format)
NORM_COLUMNS = {
    "residual_scale": ("mean |λ|", ".3g"),
    "pointwise_alpha": ("DyT/Derf α", ".3f"),
    "saturation": ("saturation", ".3f"),
}


def norm_columns(run: Run) -> dict[str, Any]:
    """{kind: mean over its keys, or None} from the last train row holding any of them."""
    return last_logged(run, NORM_COLUMNS, _kind, lambda _, values: float(np.mean(values)))


def _kind(key: str) -> str | None:
    """'residual_scale' of 'residual_scale/block_1_attn' (a key without '/' is no column's)."""
    return key.split("/", 1)[0] if "/" in key else None


def norm_label(model: dict[str, Any]) -> str:
    """'+dyt+layerscale:0.1' for the norm-side switches a run has on ('' for none)."""
    label = ""
    if model.get("norm") in ("dyt", "derf"):
        label += f"+{model['norm']}"
    if model.get("residual_scale") not in (None, "none"):
        init = model.get("residual_scale_init")
        label += f"+{model['residual_scale']}" + ("" if init is None else f":{init:g}")
    if model.get("placement") == "keel" and model.get("keel_alpha") not in (None, "sublayers"):
        label += f"+alpha:{model['keel_alpha']}"
    return label
