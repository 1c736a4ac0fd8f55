"""Live progress (rich) on a terminal; plain lines at evaluation steps otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class ProgressDisplay:
    def __init__(self, name: str, total: int, start: int, enabled: bool, console: Console) -> None:
        self.console, self.name, self.total = console, name, total
        self.live = enabled and console.is_terminal and sys.stdout.isatty()
        self.verbose = enabled
        self._bar: Progress | None = None
        if self.live:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s"),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task(name, total=total, completed=start, loss="-", tps="-")
            self._bar.start()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self._bar is not None:
            self._bar.update(
                self._task, completed=step, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}"
            )

    def message(self, text: str) -> None:
        """A line above the bar (or a plain line without one)."""
        if self.verbose or self.live:
            self.console.print(text, highlight=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
