"""Tokenise a stream of documents with `num_proc` processes in bounded memory.

Documents are grouped into batches of about `batch_mb` MB of text; each batch is encoded by one
process (the tokenizer's own batch encode, one thread) and comes back as the two splits' token
arrays, EOS already in place; batches are written in input order as they finish. At most
2 x num_proc batches are in flight, so memory is bounded by the batch size (a worker holds about
30x its batch of text while encoding: the tokenizer's encodings and the id lists) times the
processes, plus the tokenizers, whatever the size of the corpus. Progress (rich, on a terminal)
shows the input bytes done, tokens/s and the time left.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from normlab.data.tokenizer import Kind, encoder
from normlab.data.tokenizer_checks import encode_error
from normlab.data.writer import SplitWriter, route
from normlab.launch.progress import Stages, interactive

Batch = tuple[list[str], np.ndarray, np.ndarray, int]  # texts, is_val, eos, utf-8 bytes
_STATE: dict[str, Any] = {}


def batches(
    docs: Iterable[tuple[str, bool]],
    is_val: np.ndarray,
    eos: np.ndarray,
    sizes: np.ndarray,
    batch_bytes: int,
) -> Iterator[Batch]:
    """Consecutive documents in groups of about `batch_bytes` bytes of text (`sizes`: the
    UTF-8 bytes of each document, from the scan)."""
    texts: list[str] = []
    start = size = 0
    for i, (text, _) in enumerate(docs):
        texts.append(text)
        size += int(sizes[i])
        if size >= batch_bytes:
            yield texts, is_val[start : i + 1], eos[start : i + 1], size
            texts, start, size = [], i + 1, 0
    if texts:
        yield texts, is_val[start:], eos[start:], size


def init_worker(kind: Kind, path: str, eos_id: int, dtype: str) -> None:
    _STATE.update(encode=encoder(kind, path), eos_id=eos_id, dtype=np.dtype(dtype))


POOL_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _pool_worker(*init: Any) -> None:
    """A pool worker: Ctrl-C goes to the parent, which stops the pool (no traceback per worker).

    SIGTERM and SIGUSR1 get their default action back: a fork inherits the parent's Python
    handlers (`normlab train` installs its checkpoint-on-signal ones before it prepares the
    bundled corpus), and a worker that only notes a SIGTERM outlives `Pool.terminate`, whose join
    then waits forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in POOL_STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # blocked since the fork (_pool): a stop signal that
        signal.pthread_sigmask(signal.SIG_UNBLOCK, POOL_STOP_SIGNALS)  # came meanwhile acts now
    init_worker(*init)


def encode_batch(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    texts, is_val, eos, _ = batch
    try:
        ids = _STATE["encode"](texts)
    except Exception as exc:  # tokenizers' bare Exception: one line, not a worker traceback
        raise encode_error(exc, f"a batch of {len(texts)} documents") from None
    try:
        return route(ids, is_val, eos, _STATE["eos_id"], _STATE["dtype"])
    except OverflowError:  # an id the token arrays' dtype cannot hold
        raise encode_error(OverflowError(f"an id beyond {_STATE['dtype']}"), "into ids") from None


def _progress(total_bytes: int) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        FileSizeColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TotalFileSizeColumn,
    )

    console = Console(stderr=True)
    return Progress(
        TextColumn("tokenizing"),
        BarColumn(),
        FileSizeColumn(),
        TextColumn("/"),
        TotalFileSizeColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )


def encode_all(
    work: Iterator[Batch],
    writer: SplitWriter,
    init: tuple[Kind, str, int, str],
    num_proc: int,
    total_bytes: int,
) -> float:
    """Encode every batch of `work` into `writer`; returns the seconds taken."""
    t0 = time.perf_counter()
    pool = _pool(init, num_proc) if num_proc > 1 else None  # forked before any display thread
    try:
        # a terminal: the bar; a log: a line per stage and, while long, its estimate
        log = Stages("prepare", live=False, quiet=interactive(sys.stderr))
        stage = log.stage("tokenizing (bytes)", total_bytes)
        with _progress(total_bytes) as bar, log, stage as tick:
            task = bar.add_task("tokenizing", total=total_bytes, rate="")
            tokens = 0

            def done(result: tuple[np.ndarray, np.ndarray], nbytes: int) -> None:
                nonlocal tokens
                tokens += writer.append(*result)
                rate = tokens / max(time.perf_counter() - t0, 1e-9)
                bar.update(task, advance=nbytes, rate=f"{tokens:,} tok  {rate:,.0f} tok/s")
                tick(nbytes)

            if pool is None:
                init_worker(*init)
                for b in work:
                    done(encode_batch(b), b[3])
            else:
                _ordered(pool, work, num_proc, done)
        if pool is not None:
            pool.close()  # every result is in: the workers exit on their own
            pool.join()
            pool = None
    finally:
        if pool is not None:  # an error or Ctrl-C: stop the workers
            pool.terminate()
            pool.join()
    return time.perf_counter() - t0


def _pool(init: tuple, num_proc: int) -> Any:
    """fork: no re-import of the caller's __main__ (spawn would re-run an unguarded script) and
    no interpreter start per worker; the workers only run the tokenizer and numpy.

    The stop signals are blocked while the workers are forked (the pool's handler thread, which
    forks replacements, keeps that mask): a worker that `Pool.terminate` signals before its
    initializer has reset the parent's record-only handler would otherwise live on, and, when
    the worker killed beside it held the task queue's lock, wait on it forever, and the pool's
    join with it (a hung test on a loaded CI machine)."""
    ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    masking = hasattr(signal, "pthread_sigmask")  # not on Windows (spawn: nothing inherited)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, POOL_STOP_SIGNALS) if masking else None
    try:
        return ctx.Pool(num_proc, initializer=_pool_worker, initargs=init)
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _ordered(pool: Any, work: Iterator[Batch], num_proc: int, done: Any) -> None:
    """In input order, bounded: submit until 2 x num_proc batches are pending, then wait on the
    oldest."""
    pending: deque[tuple[Any, int]] = deque()
    for b in work:
        pending.append((pool.apply_async(encode_batch, (b,)), b[3]))
        while len(pending) >= 2 * num_proc:
            result, nbytes = pending.popleft()
            done(result.get(), nbytes)
    while pending:
        result, nbytes = pending.popleft()
        done(result.get(), nbytes)
