"""Atomic checkpoints under <run_dir>/checkpoints.

Write into `.tmp-step_X`, fsync, write the manifest (sizes and sha256 of every file), rename to
`step_X`, then replace the `latest` pointer (a text file naming the directory) with os.replace,
then prune to the last k. A crash at any point leaves either the previous checkpoint or the new
one as `latest`, never a half-written one. Loading verifies the manifest first and names a damaged
file; a full disk mid-save removes the temporary directory and leaves `latest` where it was.
An asynchronous save (checkpoint.async) writes `.tmp-step_X` in the background while training
goes on; the same commit (manifest, rename, `latest`) runs only after every rank's write has
completed (`poll`, `wait`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from normlab.launch.engines.base import Engine
from normlab.launch.errors import CheckpointError
from normlab.launch.rundir.manifest import find_damage, write_manifest
from normlab.launch.rundir.resume import reapply, recipe_hyperparams

LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d{8})$")
FULL_BYTES = 1 << 20  # a save that failed with less free space than this hit a full disk


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

    def __init__(
        self, run_dir: Path, keep_last: int, asynchronous: bool = False, pinned: int | None = None
    ) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        # a step whose checkpoint outlives keep_last (WSD: the end of the stable phase)
        self.pinned = step_dir_name(pinned) if pinned is not None else None
        self.asynchronous = asynchronous
        self._pending: tuple[Future[Any], Path, Path] | None = None
        self.recipe_changes: list[str] = []  # set by load()
        self.allow_unverified = False  # load a checkpoint without manifest.json (--allow-...)

    def step_dirs(self) -> list[Path]:
        """Complete checkpoint directories, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))

    def latest(self) -> Path | None:
        """The directory `latest` names (or the newest complete one if the pointer is missing)."""
        pointer = self.root / LATEST
        if pointer.is_file():
            try:
                name = pointer.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                name = "<unreadable bytes>"
            target = self.root / name
            if not STEP_DIR.match(name) or not target.is_dir():
                raise CheckpointError(
                    f"{pointer} names {name!r}, which is not a checkpoint directory"
                    f"{self._offer(None)}"
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
        try:
            engine.save(tmp, extra_state)
            engine.barrier()
            if engine.is_main:
                self._commit(tmp, final)
        except (OSError, RuntimeError) as exc:
            full = _disk_full(exc, tmp)
            if full is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # frees the space the partial save took
            raise CheckpointError(
                f"no space left on device while writing {full}; the previous checkpoint "
                f"{self.latest() or '(none)'} is intact: free space and run the same command "
                "again to resume from it"
            ) from None
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
            if engine.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"asynchronous save of {final.name} failed ({exc}); the previous checkpoint "
                f"{self.latest() or '(none)'} is intact"
            ) from None
        engine.barrier()
        if engine.is_main:
            self._commit(tmp, final)
        engine.barrier()

    def _commit(self, tmp: Path, final: Path) -> None:
        _fsync_tree(tmp)
        write_manifest(tmp)  # last file written, before the rename and before `latest` moves
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
        self.prune(keep=final.name)

    def prune(self, keep: str) -> None:
        """Keep the newest keep_last complete checkpoints (and always `keep` and the pinned one)."""
        dirs = self.step_dirs()
        for old in dirs[: max(0, len(dirs) - self.keep_last)]:
            if old.name not in (keep, self.pinned):
                shutil.rmtree(old)

    def load(self, engine: Engine, step: str | None = None) -> tuple[Path, dict[str, Any]] | None:
        """Restore the latest checkpoint (or the one `step` names) into `engine` after checking
        its manifest; the recipe's optimizer hyperparameters are kept (launch.rundir.resume).
        None when there is none. `self.recipe_changes` lists the values the recipe changed."""
        ckpt = self.find(step) if step is not None else self.latest()
        if ckpt is None:
            return None
        return ckpt, self.restore(engine, ckpt)

    def restore(self, engine: Engine, ckpt: Path) -> dict[str, Any]:
        """Load `ckpt` into `engine` (resume, or a spike-policy rollback mid-run): the manifest is
        checked first and the recipe's optimizer hyperparameters survive the load. Returns the
        trainer state saved with it."""
        damage = find_damage(ckpt, self.allow_unverified)
        if damage is not None:
            raise CheckpointError(f"checkpoint {ckpt.name} is damaged: {damage}{self._offer(ckpt)}")
        recipe = recipe_hyperparams(engine.optimizer)
        try:
            extra = engine.load(ckpt)
        except CheckpointError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot restore checkpoint {ckpt}: {exc}") from None
        if not isinstance(extra, dict) or "step" not in extra:
            raise CheckpointError(f"checkpoint {ckpt} has no trainer state (step missing)")
        self.recipe_changes = reapply(engine.optimizer, recipe)
        return extra

    def find(self, step: str) -> Path:
        """The checkpoint directory `step` names: step_00000400, step_400 or 400."""
        digits = str(step).removeprefix("step_")
        ckpt = self.root / step_dir_name(int(digits)) if digits.isdigit() else None
        if ckpt is None or not ckpt.is_dir():
            found = ", ".join(p.name for p in self.step_dirs()) or "none"
            raise CheckpointError(f"no checkpoint {step!r} in {self.root} (found: {found})")
        return ckpt

    def _offer(self, damaged: Path | None) -> str:
        """'; resume from the previous verified checkpoint with --from step_X' (or why not)."""
        older = [p for p in self.step_dirs() if damaged is None or p.name < damaged.name]
        for ckpt in reversed(older):
            if find_damage(ckpt) is None:
                return (
                    f"; the previous verified checkpoint is {ckpt.name}: resume from it with "
                    f"`normlab train {self.root.parent} --from {ckpt.name}` (several processes: "
                    f"the same `normlab launch` command with --from {ckpt.name})"
                )
        return "; no earlier verified checkpoint exists (move checkpoints/ away to start over)"

    def remove_stale(self) -> None:
        """Temporary directories left by a crash mid-save, and a universal conversion already
        loaded (called once the resume succeeded)."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith((".tmp-", ".old-", ".universal-")) and p.is_dir():
                    shutil.rmtree(p)


def _disk_full(exc: BaseException, tmp: Path) -> Path | None:
    """The file being written when the disk (or quota) filled, None for another error. torch's
    writers turn ENOSPC into a RuntimeError without errno, so an empty filesystem also counts."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    codes = {getattr(e, "errno", None) for e in chain}
    if not codes & {errno.ENOSPC, errno.EDQUOT}:
        try:
            st = os.statvfs(tmp if tmp.exists() else tmp.parent)
        except OSError:
            return None
        if st.f_bavail * st.f_frsize > FULL_BYTES:
            return None
    named = [Path(e.filename) for e in chain if isinstance(getattr(e, "filename", None), str)]
    if named:
        return named[0]
    files = sorted((p for p in tmp.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else tmp
