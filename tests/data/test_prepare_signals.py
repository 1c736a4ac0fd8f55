"""`prepare`'s worker pool under normlab's stop-signal handlers.

`normlab train` installs checkpoint-on-signal handlers (GracefulStop) before it prepares the bundled
corpus on a fresh machine. Forked pool workers inherit those Python handlers; a worker that only
records a SIGTERM outlives `Pool.terminate` and the prepare hangs in its join (seen on a fresh
checkout: `normlab train pre` stuck at 0 % CPU with one worker blocked on the pool's queue lock).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from normlab.data import prepare_encode
from normlab.launch.rundir.signals import GracefulStop


def _dispositions() -> tuple[object, object, object]:
    return tuple(signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT))


def test_pool_workers_take_the_default_stop_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare_encode, "init_worker", lambda *init: None)  # no tokenizer needed
    with GracefulStop():
        assert callable(signal.getsignal(signal.SIGTERM))  # the parent's own handler is installed
        pool = prepare_encode._pool(("bpe", "unused", 0, "uint16"), 2)
        try:
            seen = [pool.apply_async(_dispositions).get(timeout=30) for _ in range(4)]
        finally:
            pool.terminate()
            pool.join()
    for term, usr1, intr in seen:
        assert term == signal.SIG_DFL and usr1 == signal.SIG_DFL  # Pool.terminate can stop it
        assert intr == signal.SIG_IGN  # Ctrl-C goes to the parent only


@pytest.mark.parametrize("repeat", range(3))
def test_prepare_with_two_processes_finishes_inside_graceful_stop(tmp_path, repeat) -> None:
    """The whole path `normlab train` takes, in a fresh interpreter with a deadline."""
    src = tmp_path / "corpus.txt"
    lines = (f"line {i} of a small corpus, word{i % 97} and more\n" for i in range(6000))
    src.write_text("".join(lines))
    code = textwrap.dedent(f"""
        from normlab.data.prepare import prepare
        from normlab.launch.rundir.signals import GracefulStop
        with GracefulStop():
            prepare([{str(src)!r}], {str(tmp_path / "out")!r}, vocab_size=300,
                    val_fraction=0.05, num_proc=2, batch_mb=0.02)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "train.bin").stat().st_size > 0


def _slow_start(*init: object) -> None:
    """A worker the scheduler starts late: the parent's handlers are still in place."""
    import time

    time.sleep(1.0)
    _real_pool_worker(*init)


_real_pool_worker = prepare_encode._pool_worker


def test_a_worker_signalled_before_its_initializer_still_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pool.terminate's SIGTERM reaching a worker before it has reset the parent's record-only
    handler: blocked since the fork, the signal acts once the default action is back."""
    monkeypatch.setattr(prepare_encode, "_pool_worker", _slow_start)
    with GracefulStop():
        pool = prepare_encode._pool(("bpe", "unused", 0, "uint16"), 2)
        workers = list(pool._pool)
        try:
            for w in workers:
                w.terminate()  # during the sleep, before the reset
            deadline = time.monotonic() + 30
            for w in workers:  # the pool's handler thread reaps exited workers too: a join
                w.join(timeout=30)  # racing it can read no exit code yet, so wait for one
                while w.exitcode is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert [w.exitcode for w in workers] == [-signal.SIGTERM] * 2
        finally:
            pool.terminate()
            pool.join()
