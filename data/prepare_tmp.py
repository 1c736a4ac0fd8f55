"""The temporary sibling a preparation is built in (`.NAME.tmp-XXXXXXXX/` next to `--out`):
who owns it, removing it when the preparation is stopped, and removing the ones an earlier
preparation left behind.

Every temporary folder holds OWNER (host, PID and the PID's start time from /proc) from the moment
it exists. SIGTERM and SIGHUP (when nothing else handles them, e.g. `normlab prepare` itself)
unwind the preparation like Ctrl-C, so its clean-up runs, and then end the process with the same
signal. A SIGKILL cannot be caught: the next preparation of the same `--out` removes every
`.NAME.tmp-*` folder whose owner is gone (same host, PID dead or now another process), and a
folder without OWNER (an older normlab, or a kill in the instant between creating it and writing
OWNER) once nothing in it changed for STALE_S. A folder of a live preparation, or of another host
(a shared file system), is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

OWNER = ".normlab-owner.json"
STALE_S = 3600.0  # an ownerless temporary folder untouched this long is stale
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived during the preparation (unwinds like KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _proc_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (the start time): tells a reused PID apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def make_tmp(out: Path) -> Path:
    """A new temporary folder next to `out`, with its OWNER written."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix(out), dir=out.parent))
    pid = os.getpid()
    owner = {"host": socket.gethostname(), "pid": pid, "proc_start": _proc_start(pid)}
    (tmp / OWNER).write_text(json.dumps(owner))
    return tmp


def stale_reason(tmp: Path, now: float | None = None) -> str | None:
    """Why `tmp` is left by a preparation that no longer runs, None if it may still be live."""
    try:
        owner = json.loads((tmp / OWNER).read_text())
        host, pid, start = owner["host"], owner["pid"], owner.get("proc_start")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise TypeError("pid")
    except FileNotFoundError:
        newest = max((p.stat().st_mtime for p in tmp.rglob("*")), default=tmp.stat().st_mtime)
        idle = (now if now is not None else time.time()) - max(newest, tmp.stat().st_mtime)
        return f"no owner, untouched for {idle:.0f} s" if idle > STALE_S else None
    except (OSError, ValueError, KeyError, TypeError):
        return "its owner file is unreadable"
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"PID {pid} is gone"
    except PermissionError:
        pass  # alive, another user's
    if start and _proc_start(pid) not in (None, start):
        return f"PID {pid} now belongs to another process"
    return None


def remove_stale(out: Path) -> list[str]:
    """Remove the temporary folders of `out` that earlier, stopped preparations left; return one
    line per folder removed."""
    if not out.parent.is_dir():
        return []
    removed = []
    for tmp in sorted(out.parent.glob(prefix(out) + "*")):
        if not tmp.is_dir() or tmp.is_symlink():
            continue
        with contextlib.suppress(OSError):
            why = stale_reason(tmp)
            if why is not None:
                shutil.rmtree(tmp)
                removed.append(f"removed {tmp}, left by an interrupted prepare ({why})")
    return removed


@contextlib.contextmanager
def stop_signals_unwind() -> Iterator[None]:
    """Within: SIGTERM/SIGHUP raise Stopped (clean-up handlers run); on the way out the process
    ends by that signal as it would have. Only signals still at their default action are taken
    over (a caller with its own handlers, e.g. `normlab train`, keeps them), main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in STOP_SIGNALS if signal.getsignal(s) == signal.SIG_DFL]

    def handler(signum: int, frame: object) -> None:
        for s in taken:  # a second signal during the clean-up ends the process at once
            signal.signal(s, signal.SIG_DFL)
        raise Stopped(signum)

    for s in taken:
        signal.signal(s, handler)
    try:
        yield
    except Stopped as stop:
        os.kill(os.getpid(), stop.signum)  # the default action now: the process ends here
        raise SystemExit(128 + stop.signum) from None
    finally:
        for s in taken:
            signal.signal(s, signal.SIG_DFL)
