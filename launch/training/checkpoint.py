"""Atomic checkpoints under <run_dir>/checkpoints.

Write into `.tmp-step_X`, fsync, rename to `step_X`, then replace the `latest` pointer (a text file
naming the directory) with os.replace, then prune to the last k. A crash at any point leaves either
the previous checkpoint or the new one as `latest`, never a half-written one. An asynchronous save
(checkpoint.async) writes `.tmp-step_X` in the background while training goes on; the same commit
runs only after every rank's write has completed (`poll`, `wait`).
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

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
    """Saves and restores; with `asynchronous`, the engine writes in the background and the save
    is committed (renamed, `latest` moved) only once every rank's files are complete."""

    def __init__(self, run_dir: Path, keep_last: int, asynchronous: bool = False) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        self.asynchronous = asynchronous
        self._pending: tuple[Future[Any], Path, Path] | None = None

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
        self.wait(engine)  # at most one save in flight
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if engine.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        engine.barrier()
        if self.asynchronous:  # returns once the state is staged in host memory
            self._pending = (engine.save_async(tmp, extra_state), tmp, final)
            return final
        engine.save(tmp, extra_state)
        engine.barrier()
        if engine.is_main:
            self._commit(tmp, final)
        engine.barrier()
        return final

    def poll(self, engine: Engine) -> None:
        """Commit the save in flight if every rank's part is written (collective: all ranks
        decide together, so they all see the same checkpoints afterwards)."""
        if self._pending is None:
            return
        done = torch.tensor(float(self._pending[0].done()), device=engine.device)
        if engine.all_reduce(done, "min").item() == 1.0:
            self.wait(engine)

    def wait(self, engine: Engine) -> None:
        """Block until the save in flight is written, then commit it (collective)."""
        if self._pending is None:
            return
        future, tmp, final = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as exc:  # the writer thread's error, e.g. a full disk
            raise CheckpointError(f"asynchronous save of {final.name} failed: {exc}") from None
        engine.barrier()
        if engine.is_main:
            self._commit(tmp, final)
        engine.barrier()

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
