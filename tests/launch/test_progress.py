"""launch.progress, the one progress helper of the long commands: a rich bar on a terminal, plain
lines on stderr in a log (one per stage, and while a stage runs long its count and estimate),
nothing for a quick stage, and `interactive` telling the two apart (CI, TERM=dumb, pipes)."""

from __future__ import annotations

import io
import re

import pytest
from normlab.launch import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_stage_with_its_count() -> None:
    out = io.StringIO()
    with progress.Stages("cmd", stream=out, live=False, short_s=0.0) as stages:
        with stages.stage("first", 3) as tick:
            for _ in range(3):
                tick()
        with stages.stage("second") as tick:
            tick(5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"cmd: first: 3/3 in \d+\.\d s", lines[0]), lines
    assert re.fullmatch(r"cmd: second: 5 in \d+\.\d s", lines[1]), lines


def test_a_long_stage_says_how_far_and_how_long_is_left(monkeypatch) -> None:
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    stages = progress.Stages("cmd", stream=out, live=False)
    with stages, stages.stage("work", 4) as tick:
        tick()  # started at t=0, now t=1 (1 done): 3 more at 1 s each
    first = out.getvalue().splitlines()[0]
    assert first == "cmd: work: 1/4 after 1.0 s, about 3.0 s left", first


def test_a_quick_stage_leaves_no_line_and_quiet_shows_nothing() -> None:
    out = io.StringIO()
    stages = progress.Stages("cmd", stream=out, live=False, short_s=60.0)
    with stages, stages.stage("quick", 1) as tick:
        tick()
    with progress.Stages("cmd", stream=out, quiet=True, short_s=0.0) as stages:
        stages.line("said")
        with stages.stage("quiet", 1) as tick:
            tick()
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("env", "stream", "live"),
    [
        ({}, _Tty(), True),
        ({"CI": "true"}, _Tty(), False),
        ({"TERM": "dumb"}, _Tty(), False),
        ({"NORMLAB_PROGRESS": "0"}, _Tty(), False),
        ({}, io.StringIO(), False),  # a pipe or a log file
    ],
)
def test_interactive_means_a_terminal_outside_ci(monkeypatch, env, stream, live) -> None:
    for key in ("CI", "TERM", "NORMLAB_PROGRESS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert progress.interactive(stream) is live


def test_on_a_terminal_a_rich_bar_shows_the_stage(monkeypatch) -> None:
    out = _Tty()
    stages = progress.Stages("cmd", stream=out, live=True)
    with stages, stages.stage("drawing", 2) as tick:
        tick()
        tick()
    assert "cmd: drawing" in out.getvalue() and "2/2" in out.getvalue()
