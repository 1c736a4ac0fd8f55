"""Run-directory rules: resume a run with the same config, refuse a different one without --force,
and never touch a directory that is not a normlab run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from launch.config import RunConfig
from launch.errors import RunDirError

CONFIG, PREVIOUS_CONFIG, SUMMARY = "config.yaml", "config.previous.yaml", "summary.json"
IGNORED = {"run_dir", "logging"}  # settings that may change between invocations of one run


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'key: old -> new' for every differing dotted key outside IGNORED."""
    a = flatten({k: v for k, v in old.items() if k not in IGNORED})
    b = flatten({k: v for k, v in new.items() if k not in IGNORED})
    return [
        f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def check_run_dir(run_dir: Path, cfg: RunConfig, force: bool) -> list[str]:
    """Read-only check before anything is written. Returns the config differences (empty when
    the directory is new or holds this very config); raises RunDirError when it must not be used."""
    if not run_dir.exists():
        return []
    if not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} exists and is not a directory")
    cfg_path = run_dir / CONFIG
    if not cfg_path.is_file():
        if any(run_dir.iterdir()):
            raise RunDirError(
                f"run_dir {run_dir} is not empty and holds no {CONFIG}: not a normlab run; "
                "choose another run_dir"
            )
        return []
    try:
        old = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RunDirError(f"{cfg_path} is not valid YAML ({exc}); fix or move it") from None
    diff = config_diff(old, cfg.to_dict())
    if diff and not force:
        shown = "; ".join(diff[:4]) + (f"; ... {len(diff) - 4} more" if len(diff) > 4 else "")
        raise RunDirError(
            f"run_dir {run_dir} holds a run with a different config ({shown}); pass --force to "
            "continue it with this config, or choose another run_dir"
        )
    return diff


def write_config(run_dir: Path, cfg: RunConfig, replaced: bool) -> None:
    """Save the resolved config; a config replaced under --force is kept as config.previous.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG
    if replaced and path.is_file():
        shutil.copyfile(path, run_dir / PREVIOUS_CONFIG)
    tmp = run_dir / f".{CONFIG}.tmp"
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, path)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    tmp = run_dir / f".{SUMMARY}.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, run_dir / SUMMARY)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None
