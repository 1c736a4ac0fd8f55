"""The recipe is the source of truth on resume: optimizer hyperparameters come from the recipe,
only the optimizer's state (moments, step counts) from the checkpoint.

`torch.optim.Optimizer.load_state_dict` (and FSDP's set_state_dict, DeepSpeed's load_checkpoint,
which call it) replaces every param group's hyperparameters with the saved ones, so after
`--force` with a new optim.lr the resumed steps would still use the old rate. The trainer builds
the optimizer from the recipe first; `recipe_hyperparams` snapshots its groups, the checkpoint is
loaded, and `reapply` writes the recipe's values back. Groups are matched by their name (`group`
or `name` key, as set by launch.optim and the Muon groups), else by position; every key except
`params` and `lr` is restored, so an optimizer with other hyperparameters (momentum, ns_steps)
needs nothing here. `lr` is derived: the schedule, rebuilt from the recipe on every start, sets it
from `initial_lr` before each step.
"""

from __future__ import annotations

from typing import Any

import torch

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
