"""compare's columns for the attention stabilizers (launch/instruments/stabilizers.py): the last
logged value of each statistic, averaged over blocks (massive activations: the largest block)."""

from __future__ import annotations

from typing import Any

import numpy as np
from normlab.launch.metric_keys import parse_block_key
from normlab.launch.rundir.runs import Run, last_logged

# key -> (column label, format, reduction over blocks)
STABILIZER_COLUMNS = {
    "gate_mean": ("gate mean", ".3f", np.mean),
    "first_token_share": ("1st-token share", ".3f", np.mean),
    "sink_mass": ("sink mass", ".3f", np.mean),
    "attn_cap_share": ("attn cap share", ".2e", np.mean),
    "final_cap_share": ("final cap share", ".2e", np.mean),
    "massive_act": ("massive act.", ".1f", np.max),
}


def stabilizer_columns(run: Run) -> dict[str, Any]:
    """{key: value or None} from the last train row holding any of them."""
    return last_logged(run, STABILIZER_COLUMNS, _kind, _reduce)


def _kind(key: str) -> str:
    """A per-block key's kind ('gate_mean' of 'gate_mean/block_1'); any other key as it is."""
    parsed = parse_block_key(key)
    return parsed[0] if parsed and parsed[2] is None else key


def _reduce(kind: str, values: list[float]) -> float:
    return float(STABILIZER_COLUMNS[kind][2](values))


def stabilizer_label(model: dict[str, Any]) -> str:
    """'+gate:headwise+sinks+softcap:50/30' for the switches a run has on ('' for none)."""
    label = ""
    if model.get("attn_gate") not in (None, "none"):
        label += f"+gate:{model['attn_gate']}"
    if model.get("attn_sinks"):
        label += "+sinks"
    caps = (model.get("attn_softcap"), model.get("final_softcap"))
    if any(c is not None for c in caps):
        label += "+softcap:" + "/".join("-" if c is None else f"{c:g}" for c in caps)
    return label
