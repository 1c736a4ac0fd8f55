"""A family's claims decided on several cores (`normlab verdicts --jobs`).

Every claim's p-values, interval, side permutation p and seed count depend on its own two cells
only (Holm runs between the two stages, in the parent), and every random number is drawn from a
generator seeded per claim (the sequential Monte-Carlo p, the simulated seed counts), so the
answers are the same on 1 or k cores, in the same order. Worker processes are forked: the cells
are shared copy-on-write, only an index travels to a worker and one claim's result back. Fork is
used only where the platform has it and the caller asks for more than one job; a command that
may have started threads before (torch) keeps the default of one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

MIN_PARALLEL = 48  # fewer items than this: one process (a fork costs more than it saves)

_WORK: tuple[Callable[[Any, int], Any], Any] | None = None


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _one(i: int) -> Any:
    assert _WORK is not None
    fn, data = _WORK
    return fn(data, i)


def fan_out(
    fn: Callable[[Any, int], Any],
    data: Any,
    count: int,
    tick: Callable[[], None],
    jobs: int = 1,
) -> list[Any]:
    """[fn(data, i) for i in range(count)], on up to `jobs` forked processes, in order; `tick`
    after each result (the progress bar). `fn` must be a module-level function."""
    global _WORK
    jobs = max(1, min(jobs, count))
    if jobs == 1 or count < MIN_PARALLEL or "fork" not in mp.get_all_start_methods():
        out = []
        for i in range(count):
            out.append(fn(data, i))
            tick()
        return out
    _WORK = (fn, data)
    try:
        with mp.get_context("fork").Pool(jobs) as pool:
            out = []
            for result in pool.imap(_one, range(count), chunksize=max(1, count // (16 * jobs))):
                out.append(result)
                tick()
            return out
    finally:
        _WORK = None
