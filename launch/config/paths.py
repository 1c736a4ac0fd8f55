"""Paths in a saved config are absolute, so a run resumes, exports and compares from any working
directory: `saved_form(cfg)` is the dict that config.yaml holds (and that a resumed run's config
is compared with), with every path key resolved against the directory the command ran in."""

from __future__ import annotations

import copy
import os
from typing import Any

# dotted keys holding a path, and the values that are names rather than paths
PATH_KEYS = ("run_dir", "data.dataset", "engine.deepspeed_config")
NOT_PATHS = {"data.dataset": {"bundled"}}
LIST_PATHS = (("data.sources", "path"),)  # a list of mappings, each with a path under "path"


def absolute(path: str) -> str:
    """`path` made absolute against the working directory (~ expanded, symlinks kept)."""
    return os.path.abspath(os.path.expanduser(path))


def _parent(d: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    *head, last = dotted.split(".")
    for key in head:
        d = d.get(key) if isinstance(d, dict) else None  # type: ignore[assignment]
    return (d if isinstance(d, dict) else None), last


def with_absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config dict whose path values are absolute."""
    out = copy.deepcopy(data)
    for dotted in PATH_KEYS:
        parent, key = _parent(out, dotted)
        value = parent.get(key) if parent else None
        if isinstance(value, str) and value and value not in NOT_PATHS.get(dotted, ()):
            parent[key] = absolute(value)  # type: ignore[index]
    for dotted, key in LIST_PATHS:
        parent, last = _parent(out, dotted)
        for item in (parent or {}).get(last) or []:
            if isinstance(item, dict) and isinstance(item.get(key), str):
                item[key] = absolute(item[key])
    return out


def saved_form(cfg: Any) -> dict[str, Any]:
    """What config.yaml stores for `cfg` (a RunConfig): its dict with absolute paths."""
    return with_absolute_paths(cfg.to_dict())
