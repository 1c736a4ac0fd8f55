"""Where a long command is: one helper for `verdicts`, `study`, `warnings`, `coordcheck`,
`prepare` and `export`.

On a terminal, a rich progress bar per stage (count, elapsed time and rich's estimate of the time
left). Elsewhere (a log file, a pipe, CI=true, TERM=dumb) plain lines on stderr: one when a stage
ends (its count and seconds; none for a stage under SHORT_S, so quick commands print as before),
and for a stage that runs long one line every HEARTBEAT_S seconds with its count and the
estimated time left, so a log shows where a command is without a screen
of bar redraws. Output goes to stderr: what a command prints on stdout stays as it was.

    with Stages("verdicts") as stages:
        with stages.stage("deciding claims", total=len(claims)) as tick:
            for claim in claims:
                ...
                tick()
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

HEARTBEAT_S = 30.0  # seconds between a long stage's plain lines
SHORT_S = 1.0  # a stage shorter than this leaves no plain line (a quick command stays quiet)
OFF = {"", "0", "false", "no"}


def interactive(stream: IO[str]) -> bool:
    """A terminal a person watches: a TTY, not CI, not TERM=dumb (and NORMLAB_PROGRESS not 0)."""
    if os.environ.get("NORMLAB_PROGRESS", "").lower() in {"0", "false", "no", "off"}:
        return False
    if os.environ.get("CI", "").lower() not in OFF or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _clock(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes}:{sec:02d} min" if minutes < 60 else f"{minutes // 60}:{minutes % 60:02d} h"


class Stages:
    """The stages of one command (a context manager); `live` None: decided by `interactive`;
    `quiet`: shows nothing (a caller that did not ask for progress)."""

    def __init__(
        self,
        title: str,
        stream: IO[str] | None = None,
        live: bool | None = None,
        quiet: bool = False,
        short_s: float | None = None,
    ) -> None:
        self.title, self.quiet = title, quiet
        self.short_s = SHORT_S if short_s is None else short_s
        self.stream = stream if stream is not None else sys.stderr
        self.live = not quiet and (interactive(self.stream) if live is None else live)
        self._bar: Any = None

    def __enter__(self) -> Stages:
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def line(self, text: str) -> None:
        """A plain line under the command's title (above the bar on a terminal); none when
        quiet (a library call that shows nothing)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(f"{self.title}: {text}", highlight=False, markup=False)
        else:
            print(f"{self.title}: {text}", file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        """One stage of `total` items (None: unknown); yields tick(n=1) to call as items end."""
        start = time.monotonic()
        done = 0
        task = self._bar.add_task(f"{self.title}: {name}", total=total) if self._bar else None
        last_line = start

        def tick(n: int = 1) -> None:
            nonlocal done, last_line
            done += n
            if task is not None:
                self._bar.update(task, advance=n)
                return
            now = time.monotonic()
            if now - last_line >= HEARTBEAT_S and (total is None or done < total):
                last_line = now
                left = self._left(done, total, now - start)
                self.line(f"{name}: {self._count(done, total)}{left}")

        yield tick
        took = time.monotonic() - start
        if task is not None:
            self._bar.update(task, completed=total if total is not None else done)
        elif took >= self.short_s:
            self.line(f"{name}: {self._count(done, total)} in {_clock(took)}")

    @staticmethod
    def _count(done: int, total: int | None) -> str:
        return f"{done}/{total}" if total is not None else f"{done}"

    @staticmethod
    def _left(done: int, total: int | None, elapsed: float) -> str:
        if not total or not done or done >= total:
            return f" after {_clock(elapsed)}"
        return f" after {_clock(elapsed)}, about {_clock(elapsed * (total - done) / done)} left"


def stages(title: str) -> Stages:
    """The command's Stages on stderr (a bar on a terminal, plain lines elsewhere)."""
    return Stages(title)
