"""Run-directory rules: resume a run with the same config, refuse a different one without --force,
never touch a directory that is not a normlab run, and one owner at a time: a live local process
(RunDirLock) or a SLURM job that is pending or running for it (cluster.owner.check_owner_job)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from normlab.launch.config import RunConfig
from normlab.launch.config.paths import saved_form, with_absolute_paths
from normlab.launch.errors import RunDirError

CONFIG, PREVIOUS_CONFIG, SUMMARY = "config.yaml", "config.previous.yaml", "summary.json"
IGNORED = {"run_dir", "logging"}  # settings that may change between invocations of one run
# how a global batch is split over ranks and micro-batches: free to change on resume (another
# number of ranks); the checkpoint's global batch is checked instead (training.resume)
LAYOUT = {"data.batch_size", "training.grad_accum"}


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'key: old -> new' for every differing dotted key outside IGNORED."""
    old, new = one_spelling(old), one_spelling(new)
    a, b = ({k: v for k, v in flatten(d).items() if _compared(k)} for d in (old, new))
    return flat_diff(a, b)


def flat_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """'key: a -> b' for every key of two flat (dotted) mappings whose values differ, sorted."""
    keys = sorted(a.keys() | b.keys())
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def shown_diff(diff: list[str], limit: int) -> str:
    """The first `limit` lines of a diff in one line, and how many more there are."""
    more = len(diff) - limit
    return "; ".join(diff[:limit]) + (f"; ... {more} more" if more > 0 else "")


def one_spelling(config: dict[str, Any]) -> dict[str, Any]:
    """LayerNorm Scaling as a run saved it before it was a placement name (placement: pre,
    ln_scaling: true) reads as today's placement: ln_scaling, so such a run resumes unchanged."""
    model = config.get("model")
    if not isinstance(model, dict) or not model.get("ln_scaling"):
        return config
    return {**config, "model": {**model, "placement": "ln_scaling", "ln_scaling": None}}


def _compared(key: str) -> bool:
    return key.split(".")[0] not in IGNORED and key not in LAYOUT


def check_run_dir(run_dir: Path, cfg: RunConfig, force: bool) -> list[str]:
    """Read-only check before anything is written. Returns the config differences (empty when
    the directory is new or holds this very config); raises RunDirError when it must not be used."""
    if not run_dir.exists():
        return []
    if not run_dir.is_dir():
        raise RunDirError(f"run_dir {run_dir} exists and is not a directory")
    cfg_path = run_dir / CONFIG
    if not cfg_path.is_file():
        if any(p.name not in LOCK_FILES for p in run_dir.iterdir()):
            raise RunDirError(
                f"run_dir {run_dir} is not empty and holds no {CONFIG}: not a normlab run; "
                "choose another run_dir"
            )
        return []
    from normlab.launch.rundir.runfiles import read_config

    old = read_config(cfg_path)  # the one config.yaml reader: damage is one line
    diff = config_diff(with_absolute_paths(old), saved_form(cfg))
    if diff and not force:
        raise RunDirError(
            f"run_dir {run_dir} holds a run with a different config ({shown_diff(diff, 4)}); "
            "pass --force to "
            "continue it with this config, or choose another run_dir"
        )
    return diff


def write_config(run_dir: Path, cfg: RunConfig, replaced: bool) -> None:
    """Save the resolved config, its paths absolute (config/paths.py); a config replaced under
    --force is kept as config.previous.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG
    if replaced and path.is_file():
        shutil.copyfile(path, run_dir / PREVIOUS_CONFIG)
    _write_whole(path, yaml.safe_dump(saved_form(cfg), sort_keys=False))


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    _write_whole(run_dir / SUMMARY, json.dumps(summary, indent=2) + "\n")


def _write_whole(path: Path, text: str) -> None:
    """`path` holds all of `text` or keeps what it held: a temporary sibling renamed over it; a
    failed write (a full disk) removes the temporary file and raises."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """summary.json through the one summary reader (rundir/runfiles.py), None when the run has
    not written one; a damaged one is one DamagedFile line naming it (it is written atomically,
    so damage is a person's edit or a bad disk, not a crash)."""
    from normlab.launch.rundir.runfiles import read_summary as read_checked

    return read_checked(run_dir / SUMMARY) or None


# --- one owner per run directory ------------------------------------------------------------------
# The lock is a file created with O_CREAT | O_EXCL (atomic on local filesystems and on NFSv3+),
# holding the owner's host, PID, process start time and a token. The owner refreshes its mtime
# every HEARTBEAT_S seconds. A lock is stale when its process is gone (same host: the PID is dead
# or belongs to a newer process) or, from another host, when its heartbeat is older than STALE_S.

LOCK = ".lock"
LOCK_FILES = {LOCK, LOCK + ".break"}
HEARTBEAT_S: float | None = None  # None: $NORMLAB_LOCK_HEARTBEAT_S, else 30
STALE_S: float | None = None  # None: $NORMLAB_LOCK_STALE_S, else 300 (10 missed heartbeats)


def _seconds(value: float | None, env: str, default: float) -> float:
    """A lock timing: the module's setting, else $env (checked: a number of seconds > 0)."""
    if value is not None:
        return value
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RunDirError(f"{env} must be a number of seconds > 0, got {raw!r}")
    return seconds


def heartbeat_s() -> float:
    return _seconds(HEARTBEAT_S, "NORMLAB_LOCK_HEARTBEAT_S", 30.0)


def stale_s() -> float:
    return _seconds(STALE_S, "NORMLAB_LOCK_STALE_S", 300.0)


def check_lock_settings() -> None:
    """A bad NORMLAB_LOCK_* setting is one line (train, launch, validate, study: preflight)."""
    heartbeat_s(), stale_s()


TOKEN_ENV = "NORMLAB_RUN_LOCK"  # a launcher's lock token, inherited by the ranks it starts


class RunDirBusy(RunDirError):
    """Another live process owns the run directory."""


@dataclass(frozen=True)
class LockOwner:
    host: str
    pid: int
    started: str  # ISO time the owner took the lock
    token: str
    proc_start: str | None = None  # /proc/<pid>/stat start time (guards against PID reuse)
    command: str = ""

    def describe(self) -> str:
        what = self.command or "a process"
        return f"{what} (host {self.host}, PID {self.pid}, since {self.started})"


def _proc_start(pid: int) -> str | None:
    """The process start time in clock ticks since boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def read_lock(run_dir: Path) -> LockOwner | None:
    """The current owner of `run_dir` (live or stale), None when there is no readable lock."""
    from normlab.launch.json_file import BadJSON, read_json

    try:  # the one JSON reader; a lock it refuses is treated as unreadable
        owner = LockOwner(**read_json(Path(run_dir) / LOCK, "run-directory lock"))
    except (BadJSON, TypeError):
        return None
    texts = (owner.host, owner.started, owner.token, owner.command)
    if not all(isinstance(v, str) for v in texts) or not isinstance(owner.proc_start, str | None):
        return None  # damaged: treated like an unreadable lock
    if isinstance(owner.pid, bool) or not isinstance(owner.pid, int) or owner.pid <= 0:
        return None
    return owner


def stale_reason(run_dir: Path, owner: LockOwner) -> str | None:
    """Why the lock of `owner` is stale, or None while its owner may still be running."""
    if owner.host == socket.gethostname():
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return f"PID {owner.pid} is gone"
        except PermissionError:
            pass  # alive, owned by another user
        if owner.proc_start and _proc_start(owner.pid) not in (None, owner.proc_start):
            return f"PID {owner.pid} now belongs to another process"
        return None
    try:
        age = time.time() - (Path(run_dir) / LOCK).stat().st_mtime
    except FileNotFoundError:
        return "released"
    if age > stale_s():
        return f"no heartbeat for {age:.0f} s (limit {stale_s():g} s, NORMLAB_LOCK_STALE_S)"
    return None


class RunDirLock:
    """`with RunDirLock(run_dir, "normlab train"):` owns run_dir for the block, or raises RunDirBusy
    naming the live owner. A stale lock is taken over (and said so on stderr). A lock whose token
    is in $NORMLAB_RUN_LOCK belongs to the launcher that started this process: it is inherited."""

    def __init__(self, run_dir: Path, command: str = "normlab") -> None:
        self.run_dir, self.path, self.command = Path(run_dir), Path(run_dir) / LOCK, command
        self.owner: LockOwner | None = None
        self._created_dir = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> LockOwner:
        check_lock_settings()  # a bad setting is one line before anything is created
        inherited = read_lock(self.run_dir)
        if inherited is not None and inherited.token == os.environ.get(TOKEN_ENV):
            return inherited  # held by our launcher: nothing to do, nothing to release
        from normlab.launch.rundir.owner import check_owner_job

        check_owner_job(self.run_dir)  # a pending job would train here too once it starts
        if not self.run_dir.exists():
            self.run_dir.mkdir(parents=True)
            self._created_dir = True
        for _ in range(3):
            if self._create():
                self._start_heartbeat()
                return self.owner  # type: ignore[return-value]
            self._break_if_stale()
        raise RunDirBusy(f"could not take the lock {self.path}; retry")

    def _create(self) -> bool:
        owner = LockOwner(
            host=socket.gethostname(), pid=os.getpid(), started=_now(), token=uuid.uuid4().hex,
            proc_start=_proc_start(os.getpid()), command=self.command,
        )  # fmt: skip
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(owner)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.owner = owner
        return True

    def _break_if_stale(self) -> None:
        """Remove a stale lock; a live owner raises RunDirBusy. A second lock file serialises the
        breakers, so two processes never both remove (one of them the other's fresh) lock."""
        owner = read_lock(self.run_dir)
        if owner is None:  # unreadable: mid-write by its creator, or garbage left behind
            time.sleep(0.2)
            owner = read_lock(self.run_dir)
            if owner is None and self.path.exists():
                self._remove_garbage()
            return
        why = stale_reason(self.run_dir, owner)
        if why is None:
            raise RunDirBusy(
                f"run_dir {self.run_dir} is in use by {owner.describe()}; wait for it, stop it, "
                f"or remove {self.path} if that process is gone"
            )
        breaker = self.path.with_name(LOCK + ".break")
        try:
            fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another process is breaking it; a dead breaker expires
            if time.time() - _mtime(breaker) > 60:
                breaker.unlink(missing_ok=True)
            time.sleep(0.2)
            return
        os.close(fd)
        try:
            if read_lock(self.run_dir) == owner:
                self.path.unlink(missing_ok=True)
                msg = f"normlab: took over the stale lock of {owner.describe()}: {why}"
                print(msg, file=sys.stderr)
        finally:
            breaker.unlink(missing_ok=True)

    def _remove_garbage(self) -> None:
        if time.time() - _mtime(self.path) > 10:  # not a creator mid-write: a broken file
            self.path.unlink(missing_ok=True)
            print(f"normlab: removed the unreadable lock file {self.path}", file=sys.stderr)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(heartbeat_s()):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        self._beat = threading.Thread(target=beat, name="normlab-lock-heartbeat", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Remove the lock if this process created it (and the run dir if it made it and it is
        still empty); a lock taken over by someone else meanwhile is left alone."""
        if self.owner is None:
            return
        self._stop.set()
        if read_lock(self.run_dir) == self.owner:
            self.path.unlink(missing_ok=True)
        self.owner = None
        if self._created_dir:
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty: a failed first start leaves nothing

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
