"""What a rank started by `normlab launch` tells its launcher instead of printing it.

A refusal that only the ranks can find (a checkpoint that does not load, a world of another size)
would otherwise be printed once per rank and then buried under torchrun's failure report. Every
rank writes its one-line message into the launcher's directory ($NORMLAB_LAUNCH_ERRORS) and
prints nothing; the launcher prints the lowest rank's message once and exits with status 2.
"""

from __future__ import annotations

import os
from pathlib import Path

ERRORS_ENV = "NORMLAB_LAUNCH_ERRORS"


def report_to_launcher(message: str) -> bool:
    """Leave `message` for the launcher; False when this process was not started by one."""
    folder, rank = os.environ.get(ERRORS_ENV), os.environ.get("RANK")
    if not folder or rank is None or not Path(folder).is_dir():
        return False
    path = Path(folder) / f"rank-{int(rank):06d}"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(message + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return False  # the launcher's folder is gone: print it here after all
    return True


def first_report(folder: Path) -> str | None:
    """The message of the lowest rank that left one, None when none did."""
    reports = sorted(Path(folder).glob("rank-*"))
    for path in reports:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            return text
    return None
