"""What makes two runs of a study the same experiment, so `--merge` can refuse a source trained
with other settings (another `--steps`, a `--set` the first invocation did not have, another
corpus) instead of mixing it into the verdicts.

A run's setup is its resolved config without what may differ between two seeds of one grid point
run at different times or on different machines: the seed, the run's name and folder, the device
and engine (the same mathematics on any of them), threads, logging, checkpointing, the
instruments that only measure, how often it logs and evaluates, and how the global batch is split
(data.batch_size x training.grad_accum counts as one number). A dataset given as a path counts by
its file name; a config in an older spelling reads as today's (rundir's one_spelling, as resume).
`setup_of` is a short hash of it (results.csv's `setup` column); `setup_diff` names the keys in
which two configs differ.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePath
from typing import Any

from normlab.launch.rundir.directory import flat_diff, flatten, one_spelling

SECTIONS = ("model", "data", "optim", "schedule", "training", "precision")
LEFT_OUT = {
    "training.seed",
    "training.device",
    "training.threads",
    "training.log_every",
    "training.eval_every",
    "data.num_proc",
    "data.batch_size",
    "training.grad_accum",
}
KEPT = {"instruments.fp16_clamp.mode"}  # an instrument that changes the numbers (fp16 clamps)
HASH_CHARS = 12


def setup_items(config: dict[str, Any]) -> dict[str, Any]:
    """The dotted keys and values that define the experiment (see the module docstring)."""
    flat = flatten(one_spelling(config))  # LayerNorm Scaling's old spelling reads as today's
    items = {
        k: v
        for k, v in flat.items()
        if (k.split(".")[0] in SECTIONS and k not in LEFT_OUT) or k in KEPT
    }
    batch, accum = flat.get("data.batch_size"), flat.get("training.grad_accum") or 1
    if isinstance(batch, int) and isinstance(accum, int):
        items["data.batch_size x training.grad_accum"] = batch * accum
    for key in ("data.dataset", "data.sources"):
        value = items.get(key)
        if isinstance(value, str) and ("/" in value or "\\" in value):
            items[key] = PurePath(value).name
    return items


def setup_of(config: dict[str, Any]) -> str:
    """A short hash of `setup_items` (empty for a config with none of its sections)."""
    items = setup_items(config)
    if not items:
        return ""
    text = json.dumps(items, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def setup_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """'key: a -> b' for each setup key in which the two configs differ (sorted)."""
    return flat_diff(setup_items(a), setup_items(b))
