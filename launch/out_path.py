"""The one checked output path of normlab: every report command's --out and default output
folder goes through `check_out_dir` before anything is measured or written, so a path that is a
file, lies below a file, is read-only, or is a folder holding a user's files is one line (exit 2)
and nothing is lost; `write_text` writes a whole file or nothing (a full disk leaves none).

Default folders live under runs/ (as `normlab prepare`'s runs/data/<name> and `quickstart`'s
runs/quickstart do), which .gitignore ignores: `default_out(command)` names them.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Collection
from pathlib import Path

from normlab.launch.errors import NormlabError

RUNS = "runs"  # .gitignore's runs/: every default output folder is below it

# What each report command writes into its --out (fnmatch patterns): a folder holding anything
# else is a user's folder and is refused; a folder holding only these is an earlier report of the
# same command and is rewritten.
WRITES: dict[str, tuple[str, ...]] = {
    "compare": ("compare.md", "compare.csv", "*.png"),
    "theory": ("theory.md", "theory.json", "*.png"),
    "coordcheck": ("coordcheck.json", "coord_*.png"),
    "verdicts": ("verdicts.md", "verdicts.json", "results_from_histories.csv"),
    "warnings": ("warnings.md", "warnings.json", "*.png"),
}


# A folder holding one of these is a study's (normlab study writes them first): its reports
# (compare, verdicts, warnings) may be rewritten there, as `normlab study` itself does.
STUDY_MARKS = ("plan.json", "study.json")


def default_out(command: str) -> str:
    """A report command's default --out: runs/<command> (ignored by git, named in its --help)."""
    return f"{RUNS}/{command}"


DEFAULT_OUT = default_out("compare")  # `normlab compare`'s report folder


class OutDirError(NormlabError):
    """An --out folder cannot be created or written."""


def check_out_dir(out: Path, flag: str = "--out", writes: Collection[str] | None = None) -> None:
    """Refuse `out` when it is not a directory, when the nearest of its parents that exists is
    not a writable directory, or (with `writes`, the patterns of the files the command writes)
    when it already holds something else (a study's folder excepted). Nothing is created here."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise OutDirError(f"{flag} {out} exists and is not a directory: give a folder")
    existing = path
    while not existing.exists() and not existing.is_symlink():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutDirError(f"{flag} {out}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutDirError(f"{flag} {out}: {existing} is not writable")
    if writes is not None and path.is_dir() and not is_study_dir(path):
        try:
            names = sorted(p.name for p in path.iterdir())
        except OSError as exc:
            raise OutDirError(f"{flag} {out}: cannot list it ({exc.strerror or exc})") from None
        others = [n for n in names if not any(fnmatch.fnmatchcase(n, w) for w in writes)]
        others = [n for n in others if not (n.startswith(".") and n.endswith(".tmp"))]
        if others:
            raise OutDirError(
                f"{flag} {out} holds files this command does not write ({', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}): give a new or empty folder"
            )


def is_study_dir(path: Path) -> bool:
    return any((path / mark).is_file() for mark in STUDY_MARKS)


def make_out_dir(out: Path, flag: str = "--out", writes: Collection[str] | None = None) -> Path:
    """check_out_dir, then create it; an OSError on the way is one line naming the folder."""
    check_out_dir(out, flag, writes)
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
