"""Checkpoint manifests: the size and sha256 of every file of a step directory, written last.

`write_manifest(dir)` runs once every file is on disk and before the directory is renamed into
place and `latest` moves; `verify(dir)` checks sizes first (free), then checksums, and names the
first file that differs. Files are hashed in a thread pool (hashlib releases the GIL), so the cost
is one read of the checkpoint at disk or page-cache speed; benchmarks/bench_checkpoint.py prints
it next to the save time.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from normlab.launch.errors import CheckpointError
from normlab.launch.json_file import read_json
from normlab.launch.rundir.layout import missing_file

MANIFEST = "manifest.json"
ALGORITHM = "sha256"
BLOCK = 8 << 20


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(ckpt_dir: Path) -> list[Path]:
    return sorted(p for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def _digests(ckpt_dir: Path, files: list[Path]) -> list[str]:
    workers = min(8, os.cpu_count() or 1, max(1, len(files)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(file_digest, files))


def write_manifest(ckpt_dir: Path) -> dict[str, Any]:
    """Record every file under ckpt_dir (relative path -> bytes, sha256) in manifest.json."""
    files = _files(ckpt_dir)
    digests = _digests(ckpt_dir, files)
    entries = {
        str(p.relative_to(ckpt_dir)): {"bytes": p.stat().st_size, ALGORITHM: d}
        for p, d in zip(files, digests, strict=True)
    }
    manifest = {"algorithm": ALGORITHM, "files": entries}
    path = ckpt_dir / MANIFEST
    with path.open("w") as fh:
        fh.write(json.dumps(manifest, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return manifest


def read_manifest(ckpt_dir: Path) -> dict[str, Any] | None:
    """The manifest, None for a checkpoint written before manifests existed."""
    path = ckpt_dir / MANIFEST
    if not path.exists():
        return None
    manifest = read_json(path, "checkpoint manifest", CheckpointError)  # the one JSON reader
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path} is unreadable (no 'files' mapping)")
    return manifest


UNVERIFIED_FLAG = "--allow-unverified"


def find_damage(ckpt_dir: Path, allow_unverified: bool = False) -> str | None:
    """What is wrong with ckpt_dir ('<file>: <why>'), None when every file matches its manifest.
    A checkpoint without manifest.json (deleted, or written by a normlab before manifests) cannot
    be verified and counts as damaged unless `allow_unverified` (the CLI's --allow-unverified).
    A file the engine's own index needs and neither the disk nor the manifest has is named too
    (rundir.layout), before any file is hashed."""
    try:
        manifest = read_manifest(ckpt_dir)
    except CheckpointError as exc:
        return str(exc)
    if manifest is None:
        if allow_unverified:
            return missing_file(ckpt_dir, None)
        return (
            f"{ckpt_dir / MANIFEST} is missing, so none of its files can be verified "
            f"({UNVERIFIED_FLAG} loads it anyway)"
        )
    entries: dict[str, dict[str, Any]] = manifest["files"]
    paths = [ckpt_dir / name for name in entries]
    for path, entry in zip(paths, entries.values(), strict=True):
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != entry.get("bytes"):
            want = entry.get("bytes")
            return f"{path} is truncated or corrupt ({size} bytes, the manifest says {want})"
    missing = missing_file(ckpt_dir, set(entries))  # what the engine's index needs (layout)
    if missing is not None:
        return missing
    for path, entry, digest in zip(paths, entries.values(), _digests(ckpt_dir, paths), strict=True):
        if digest != entry.get(ALGORITHM):
            return f"{path} is corrupt (its sha256 differs from the manifest's)"
    return None
