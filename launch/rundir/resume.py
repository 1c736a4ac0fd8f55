"""The recipe is the source of truth on resume: optimizer hyperparameters come from the recipe,
only the optimizer's state (moments, step counts) from the checkpoint.

`torch.optim.Optimizer.load_state_dict` (and FSDP's set_state_dict, DeepSpeed's load_checkpoint,
which call it) replaces every param group's hyperparameters with the saved ones, so after
`--force` with a new optim.lr the resumed steps would still use the old rate. The trainer builds
the optimizer from the recipe first; `recipe_hyperparams` snapshots its groups, the checkpoint is
loaded, and `reapply` writes the recipe's values back. Groups are matched by their name (`group`
or `name` key, as set by launch.optim and the Muon groups), else by position; every key except
`params` and `lr` is restored, so an optimizer with other hyperparameters (momentum, ns_steps)
needs nothing here. `lr` is derived: before each step the schedule, rebuilt from the recipe's
optim.lr on every start, sets it (times the group's `lr_mult`).
"""

from __future__ import annotations

from typing import Any

import torch
from normlab.launch.config import RunConfig
from normlab.launch.errors import CheckpointError

Snapshot = list[tuple[str, dict[str, Any]]]
NAME_KEYS = ("group", "name")
DERIVED = ("params", "lr")  # not hyperparameters of the recipe: the model's, the schedule's


def _group_key(group: dict[str, Any], index: int) -> str:
    return next((str(group[k]) for k in NAME_KEYS if k in group), f"#{index}")


def recipe_hyperparams(opt: torch.optim.Optimizer) -> Snapshot:
    """Every param group's hyperparameters (all keys but DERIVED), keyed by group name."""
    return [
        (_group_key(g, i), {k: v for k, v in g.items() if k not in DERIVED})
        for i, g in enumerate(opt.param_groups)
    ]


def reapply(opt: torch.optim.Optimizer, snapshot: Snapshot) -> list[str]:
    """Write the snapshot's values into the loaded groups; return 'group.key: old -> new' for
    each value the checkpoint had differently (empty when the recipe did not change)."""
    wanted = dict(snapshot)
    changes = []
    for i, group in enumerate(opt.param_groups):
        key = _group_key(group, i)
        values = wanted.get(key)
        if values is None:
            continue  # a group the recipe's optimizer does not have: leave the checkpoint's
        for name, new in values.items():
            old = group.get(name)
            if not _same(old, new):
                changes.append(f"{key}.{name}: {old!r} -> {new!r}")
            group[name] = new
    return changes


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return bool(torch.as_tensor(a).eq(torch.as_tensor(b)).all())
    return a == b


# --- the global batch across world sizes ------------------------------------------------------
# The loader reads one global stream of sequences (data.mixture): any world size W, per-rank
# batch B and grad_accum A with the same W * B * A take the same sequences in every step, so a
# run may resume on another number of ranks. Another global batch would change what a step is.


def global_batch(cfg: RunConfig, world: int) -> dict[str, int]:
    d, t = cfg.data, cfg.training
    return {
        "sequences": d.batch_size * world * t.grad_accum,
        "batch_size": d.batch_size,
        "world_size": world,
        "grad_accum": t.grad_accum,
    }


def _saved_global_batch(extra: dict[str, Any]) -> dict[str, int] | None:
    if "global_batch" in extra:
        return dict(extra["global_batch"])
    loader, config = extra.get("loader", {}), extra.get("config", {})
    accum = config.get("training", {}).get("grad_accum")
    if "global_batch" in loader and accum:  # a checkpoint of the single-directory loader
        batch = config.get("data", {}).get("batch_size", loader["global_batch"])
        world = loader["global_batch"] // batch
        sequences = loader["global_batch"] * accum
        return {
            "sequences": sequences,
            "batch_size": batch,
            "world_size": world,
            "grad_accum": accum,
        }
    return None


def _layout(g: dict[str, int]) -> str:
    return (
        f"{g['sequences']} sequences (data.batch_size {g['batch_size']} x {g['world_size']} "
        f"ranks x training.grad_accum {g['grad_accum']})"
    )


def check_global_batch(extra: dict[str, Any], now: dict[str, int], force: bool) -> None:
    """Refuse, on one line naming the fix, to resume with another global batch (unless force)."""
    saved = _saved_global_batch(extra)
    if saved is None or saved["sequences"] == now["sequences"] or force:
        return
    g, w = saved["sequences"], now["world_size"]
    fixes = []
    if g % (w * now["grad_accum"]) == 0:
        fixes.append(f"data.batch_size={g // (w * now['grad_accum'])}")
    if g % (w * now["batch_size"]) == 0:
        fixes.append(f"training.grad_accum={g // (w * now['batch_size'])}")
    keep = (
        f"keep it on {w} ranks with {' or '.join(fixes)}"
        if fixes
        else f"use a number of ranks that divides {g}"
    )
    raise CheckpointError(
        f"the checkpoint was trained with a global batch of {_layout(saved)}; this run has "
        f"{_layout(now)}: {keep} to continue the same sample order, or pass --force to go on "
        "with the new global batch"
    )


# --- the data a checkpoint was trained on ------------------------------------------------------
# Every checkpoint records each source's identity (data.identity: tokenizer hash, shards
# fingerprint, sequence count). The loader state alone matches sources by name and weight, so a
# directory re-prepared under a run (another tokenizer of the same vocabulary size, another text)
# would resume without a word; `--force` (another config) does not cover it, only the flag that
# says so does.

CHANGED_DATA_FLAG = "--resume-on-changed-data"


def check_data_identity(
    extra: dict[str, Any], now: list[dict[str, Any]], allow_changed: bool, ckpt: str
) -> list[str]:
    """Refuse, in one line naming each changed source and what changed, to resume checkpoint
    `ckpt` on other data than it was trained on (unless `allow_changed`). Returns the notices to
    print: what changed when allowed, or that a checkpoint older than this check records none."""
    from normlab.data.identity import identity_changes

    saved = extra.get("data_identity")
    if not isinstance(saved, list):
        return [
            f"checkpoint {ckpt} records no data identity (written before normlab recorded it): "
            "the data it resumes on is not checked; the next checkpoint records it"
        ]
    changes = identity_changes(saved, now)
    if not changes:
        return []
    what = "; ".join(changes)
    if allow_changed:
        return [
            f"resuming {ckpt} on changed data ({CHANGED_DATA_FLAG}): {what}; the next checkpoint "
            "records the new data"
        ]
    raise CheckpointError(
        f"the data changed since checkpoint {ckpt} was written: {what}; the resumed run would "
        f"train on other tokens than it started on: restore the data, start a new run "
        f"directory, or pass {CHANGED_DATA_FLAG} to go on with the new data (--force does not)"
    )
