"""Output folders of the report commands (`theory --out`, `compare --out`): checked before any
measuring or writing, so a path below a regular file or in a read-only place is one line."""

from __future__ import annotations

import os
from pathlib import Path

from normlab.launch.errors import NormlabError

DEFAULT_OUT = "compare"  # `normlab compare`'s report folder (here: its --help needs no plots)


class OutDirError(NormlabError):
    """An --out folder cannot be created or written."""


def check_out_dir(out: Path, flag: str = "--out") -> None:
    """Refuse `out` when it, or the nearest of its parents that exists, is not a writable
    directory (nothing is created here)."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise OutDirError(f"{flag} {out} exists and is not a directory")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutDirError(f"{flag} {out}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutDirError(f"{flag} {out}: {existing} is not writable")


def make_out_dir(out: Path, flag: str = "--out") -> Path:
    """check_out_dir, then create it; an OSError on the way is one line naming the folder."""
    check_out_dir(out, flag)
    try:
        Path(out).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutDirError(f"cannot create {flag} {out}: {exc.strerror or exc}") from None
    return Path(out).expanduser()


def write_text(path: Path, text: str) -> None:
    """Write a whole file or nothing: a temporary sibling renamed over it once complete (a full
    disk leaves the previous file, if any, and no partial one)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutDirError(f"cannot write {path}: {exc.strerror or exc}") from None
