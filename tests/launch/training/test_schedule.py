"""Learning-rate schedules against hand-written formulas (SCIENCE.md section 11)."""

from __future__ import annotations

import math

import pytest
from normlab.launch.config import ScheduleSection
from normlab.launch.training.schedule import build_schedule

TOTAL = 100


def _sched(kind: str, warmup: int = 10, **kw: float) -> list[float]:
    f = build_schedule(ScheduleSection(kind=kind, warmup_steps=warmup, **kw), TOTAL, d_model=512)
    return [f(s) for s in range(1, TOTAL + 1)]


def test_linear_warmup_is_shared_by_every_decay() -> None:
    for kind in ("cosine", "linear", "constant", "wsd", "inv_sqrt"):
        lrs = _sched(kind, warmup=10)
        assert lrs[:10] == pytest.approx([s / 10 for s in range(1, 11)]), kind


def test_cosine_linear_constant() -> None:
    floor = 0.1
    cos, lin = _sched("cosine", min_lr_ratio=floor), _sched("linear", min_lr_ratio=floor)
    for s in range(11, TOTAL + 1):
        p = (s - 10) / 90
        assert cos[s - 1] == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))
        assert lin[s - 1] == pytest.approx(floor + (1 - floor) * (1 - p))
    assert cos[-1] == pytest.approx(floor) and lin[-1] == pytest.approx(floor)
    assert _sched("constant")[10:] == [1.0] * 90


def test_warmup_stable_decay() -> None:
    lrs = _sched("wsd", decay_fraction=0.2, min_lr_ratio=0.0)
    assert lrs[10:80] == [1.0] * 70  # stable until step 80
    for s in range(81, 101):
        assert lrs[s - 1] == pytest.approx(1 - (s - 80) / 20)


def test_inverse_square_root() -> None:
    lrs = _sched("inv_sqrt", warmup=16)
    for s in range(17, TOTAL + 1):
        assert lrs[s - 1] == pytest.approx(math.sqrt(16 / s))
    no_warm = _sched("inv_sqrt", warmup=0)
    assert no_warm[0] == 1.0 and no_warm[3] == pytest.approx(0.5)


def test_vaswani_at_given_steps() -> None:
    f = build_schedule(ScheduleSection(kind="vaswani", warmup_steps=4000), 100_000, d_model=512)
    for step in (1, 100, 3999, 4000, 4001, 16000, 100_000):
        want = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert f(step) == pytest.approx(want, rel=1e-12)
    assert f(4000) == pytest.approx(6.98771242968684e-4, rel=1e-9)  # the paper's peak
    assert f(16000) == pytest.approx(f(4000) / 2)
