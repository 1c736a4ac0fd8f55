"""Atomic checkpoints under <run_dir>/checkpoints.

Write into `.tmp-step_X`, fsync, rename to `step_X`, then replace the `latest` pointer (a text file
naming the directory) with os.replace, then prune to the last k. A crash at any point leaves either
the previous checkpoint or the new one as `latest`, never a half-written one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from launch.engines.base import Engine
from launch.errors import CheckpointError

LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _fsync_tree(path: Path) -> None:
    for item in sorted(path.rglob("*")):
        if item.is_file():
            with item.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def step_dirs(self) -> list[Path]:
        """Complete checkpoint directories, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))

    def latest(self) -> Path | None:
        """The directory `latest` names (or the newest complete one if the pointer is missing)."""
        pointer = self.root / LATEST
        if pointer.is_file():
            name = pointer.read_text().strip()
            target = self.root / name
            if not STEP_DIR.match(name) or not target.is_dir():
                raise CheckpointError(
                    f"{pointer} names {name!r}, which is not a checkpoint directory"
                )
            return target
        dirs = self.step_dirs()
        return dirs[-1] if dirs else None

    def save(self, engine: Engine, step: int, extra_state: dict[str, Any]) -> Path:
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if engine.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        engine.barrier()
        engine.save(tmp, extra_state)
        engine.barrier()
        if engine.is_main:
            self._commit(tmp, final)
        engine.barrier()
        return final

    def _commit(self, tmp: Path, final: Path) -> None:
        _fsync_tree(tmp)
        if final.exists():  # re-reaching a step saved before a crash that preceded `latest`
            old = final.with_name(f".old-{final.name}")
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
        pointer_tmp = self.root / f".{LATEST}.tmp"
        pointer_tmp.write_text(final.name + "\n")
        with pointer_tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(pointer_tmp, self.root / LATEST)
        _fsync_dir(self.root)
        self._prune(keep=final.name)

    def _prune(self, keep: str) -> None:
        dirs = self.step_dirs()
        for old in dirs[: max(0, len(dirs) - self.keep_last)]:
            if old.name != keep:
                shutil.rmtree(old)

    def load(self, engine: Engine) -> tuple[Path, dict[str, Any]] | None:
        """Restore the latest checkpoint into `engine`; None when there is none."""
        ckpt = self.latest()
        if ckpt is None:
            return None
        try:
            extra = engine.load(ckpt)
        except CheckpointError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot restore checkpoint {ckpt}: {exc}") from None
        if not isinstance(extra, dict) or "step" not in extra:
            raise CheckpointError(f"checkpoint {ckpt} has no trainer state (step missing)")
        return ckpt, extra

    def remove_stale(self) -> None:
        """Temporary directories left by a crash mid-save (called once the resume succeeded)."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith((".tmp-", ".old-")) and p.is_dir():
                    shutil.rmtree(p)
