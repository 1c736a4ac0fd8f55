"""Training many runs: one after the other, or N at a time in worker processes (`study`,
`quickstart`). A signal to the parent starts no further run and stops the running ones the way
a preemption does (each checkpoints after its current step); a worker whose parent died does
the same and exits."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from normlab.launch.config import RunConfig, from_dict
from rich.console import Console


def _train_one(cfg: RunConfig, console: Console, force: bool = False) -> dict[str, Any]:
    """Train (or resume, or reuse) one run; its timing row."""
    from normlab.launch.training.trainer import (
        Trainer,  # heavy imports after the arguments are checked
    )

    t0 = time.perf_counter()
    trainer = Trainer(cfg, force=force, console=console)
    status = trainer.run()
    return {
        "recipe": cfg.name,
        "lr": cfg.optim.lr,
        "seed": cfg.training.seed,
        "run_dir": cfg.run_dir,
        "status": trainer.summary.get("status", "completed" if status == 0 else "failed"),
        "seconds": round(time.perf_counter() - t0, 1),
        "signal": trainer.stopped_by,  # 0, or the signal that stopped it (with a checkpoint)
    }


_STOP: Any = None  # in a worker: the study's stop event (set once a signal stopped the study)
_PARENT = 0  # in a worker: the study's pid
_TRAINING = threading.Event()  # in a worker: a run is being trained
_SIGNALLED = threading.Event()  # in a worker: the watcher's stop signal reached the trainer


def _init_worker(event: Any) -> None:
    """Pool-worker start: remember the study's stop event and watch it and the study process.
    SIGTERM or SIGINT outside a run ends an orphaned worker and is ignored otherwise: the pool
    would break (a traceback in the study) if a worker between runs died of it."""
    global _STOP, _PARENT
    _STOP, _PARENT = event, os.getppid()
    for sig in (signal.SIGTERM, signal.SIGINT):  # Ctrl-C reaches every worker of the group
        signal.signal(sig, _outside_a_run)
    threading.Thread(target=_watch_the_study, daemon=True).start()


def _outside_a_run(signum: int, frame: object) -> None:
    if os.getppid() != _PARENT:
        os._exit(128 + signum)
    _SIGNALLED.clear()  # a run being set up missed it (no trainer handler yet): signal again


def _watch_the_study() -> None:
    """SIGTERM this worker once when the study stops (a signal to its process sets the event)
    while a run trains here, or once the study process is gone (even SIGKILLed): the trainer
    checkpoints after its step and stops, as under a preemption, so no run trains on
    unsupervised or past a stop. One signal, not a parent-death signal: Linux repeats that as
    each thread of the parent exits."""
    while os.getppid() == _PARENT:
        if _STOP.is_set() and _TRAINING.is_set() and not _SIGNALLED.is_set():
            _SIGNALLED.set()
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
    if not _TRAINING.is_set():  # orphaned between runs: nothing to checkpoint
        os._exit(128 + signal.SIGTERM)
    if not _SIGNALLED.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def _train_in_worker(plain: dict[str, Any], header: str, force: bool) -> dict[str, Any] | None:
    """One run in a spawned worker process (the config travels as its plain dict); None when
    the study was stopped before it began. Plain lines, no live bar: two bars from two processes
    would overwrite each other."""
    if _STOP is not None and _STOP.is_set():
        return None
    if os.getppid() != _PARENT:  # the study died while this run was queued
        os._exit(128 + signal.SIGTERM)
    tty = sys.stdout.isatty()
    console = Console(
        force_terminal=False, width=shutil.get_terminal_size().columns if tty else 240
    )
    console.rule(header)
    _TRAINING.set()
    try:
        row = _train_one(from_dict(plain), console, force)
    finally:
        _TRAINING.clear()
    if row["signal"]:  # a signal to the group (Ctrl-C, scancel): this worker starts nothing more,
        _STOP.set()  # nor the others, even before the study has read this result
    if os.getppid() != _PARENT:  # the study died (the run stopped with a checkpoint): nobody
        os._exit(128 + signal.SIGTERM)  # reads the result, and the pool's queues never close
    return row


def train_all(
    cfgs: list[RunConfig],
    console: Console,
    jobs: int = 1,
    force: bool = False,
    headers: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Every run, `jobs` at a time (separate processes when jobs > 1); timing rows in cfgs order.

    headers: the line printed as each run starts (default: 'study i/n: name -> run_dir')."""
    if headers is None:
        headers = [f"study {i}/{len(cfgs)}: {c.name} -> {c.run_dir}" for i, c in enumerate(cfgs, 1)]
    if jobs <= 1 or len(cfgs) <= 1:
        timings = []
        for header, cfg in zip(headers, cfgs, strict=True):
            console.rule(header)
            timings.append(_train_one(cfg, console, force))
            if timings[-1]["signal"]:  # preempted or interrupted: start no further run
                break
        return timings
    return _train_in_workers(cfgs, jobs, force, headers)


def _train_in_workers(
    cfgs: list[RunConfig], jobs: int, force: bool, headers: list[str]
) -> list[dict[str, Any]]:
    """train_all's parallel path. A signal to the study (SIGTERM or SIGINT to its process, or
    to the group when the workers get it too, as with Ctrl-C) starts no further run and stops
    the running ones with a checkpoint; the timing rows stop there."""
    from normlab.launch.training.datasets import resolve_dataset

    for data in {json.dumps(c.to_dict()["data"], sort_keys=True): c.data for c in cfgs}.values():
        resolve_dataset(data)  # prepared once here, not by two workers at the same time
    # spawn, not fork: each worker starts its own torch (thread pools do not survive a fork)
    context = multiprocessing.get_context("spawn")
    stopped = context.Event()  # also seen by a run already queued to a worker
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_init_worker, initargs=(stopped,)
    ) as pool:
        futures = [
            pool.submit(_train_in_worker, c.to_dict(), h, force)
            for c, h in zip(cfgs, headers, strict=True)
        ]

        def stop(signum: int, frame: object) -> None:  # no new run; the workers stop theirs
            stopped.set()
            for future in futures:
                future.cancel()

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        timings = []
        try:
            for future in futures:
                row = None if future.cancelled() else future.result()
                if row is None:
                    break
                timings.append(row)
                if row["signal"]:
                    stop(row["signal"], None)
        except BaseException:  # a run failed: start nothing more
            stop(signal.SIGINT, None)
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return timings
