"""How `normlab launch` runs torchrun and stays responsible for it (see `supervise`)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from pathlib import Path

from normlab.launch.rundir.signals import (
    set_child_subreaper,
    set_parent_death_signal,
    under_slurm,
)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
SHUTDOWN_TIMEOUT_S = 600


def supervise(cmd: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run torchrun and stay responsible for it; return (its exit status, signal received or 0).

    Outside SLURM torchrun gets its own session, so a terminal's Ctrl-C reaches only this process,
    which passes the first signal on: torchrun hands it to every rank, whose handlers checkpoint;
    repeats are not passed on (the ranks are already stopping, and a second signal would make
    torchrun give up waiting for them). Under SLURM slurmstepd already signals every process of
    the step, so nothing is passed on. Either way the kernel sends torchrun SIGTERM if this
    process dies, even by SIGKILL (PR_SET_PDEATHSIG), and torchrun stops its ranks the same way;
    the ranks arm the same death signal against torchrun. If torchrun dies first, its ranks are
    re-parented to this process (a child subreaper), which waits until they have checkpointed.
    """
    parent, forward = os.getpid(), not under_slurm()

    def child_setup() -> None:  # runs between fork and exec
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:  # the launcher died before the death signal was armed
            os._exit(1)

    set_child_subreaper()
    proc = subprocess.Popen(cmd, env=env, start_new_session=forward, preexec_fn=child_setup)
    received = 0

    def on_signal(signum: int, frame: object) -> None:
        nonlocal received
        if received:
            return
        received = signum
        if forward and proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in FORWARDED}
    try:
        code = proc.wait()
        wait_for_orphans(SHUTDOWN_TIMEOUT_S)  # ranks left behind by a killed torchrun
        return code, received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_for_orphans(timeout: float) -> None:
    """Reap the children this process inherited (as subreaper) until none is left; after
    `timeout` seconds the rest get SIGKILL, as torchrun's own shutdown timeout would do."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in _children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = math.inf
        time.sleep(0.1)


def _children() -> list[int]:
    """PIDs whose parent is this process (Linux /proc)."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(stat.parent.name))
    return found
