"""Spike score (SCIENCE.md 8) against hand computations and a naive loop; the rolling callback
state matches the whole-series function and survives a checkpoint."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
import torch
from normlab.launch.instruments import RollingSpikeScore, SpikeScore, spike_score
from normlab.launch.instruments.common import NONFINITE, SPIKE_GRAD, SPIKE_LOSS, SPIKE_WINDOW
from normlab.launch.instruments.spikes import run_window, spike_flags, window_stats

from tests.instrument_helpers import fake_trainer, tiny_model


def naive(values: list[float], window: int, k: float) -> float:
    flags = []
    for t in range(window, len(values)):
        prev = values[t - window : t]
        mean, std = statistics.fmean(prev), statistics.pstdev(prev)
        dev = abs(values[t] - mean)
        flags.append(dev >= k * std and dev > 0)
    return 100.0 * sum(flags) / len(flags) if flags else math.nan


def test_hand_worked_example() -> None:
    # window 4, k 2. t=4: prev [1,2,1,2] mean 1.5 std 0.5, |10-1.5| = 8.5 >= 1 -> spike.
    # t=5: prev [2,1,2,10] mean 3.75 std sqrt(13.1875)=3.63, |1.5-3.75| = 2.25 -> no.
    # t=6: prev [1,2,10,1.5] mean 3.625 std sqrt(13.671875)=3.70, |1.5-3.625| = 2.125 -> no.
    assert spike_score([1, 2, 1, 2, 10, 1.5, 1.5], window=4, k=2) == pytest.approx(100 / 3)


def test_population_std_two_sided_and_current_point_excluded() -> None:
    # prev [0, 2]: mean 1, population std 1 (sample std would be 1.414): 2.2 and -0.2 both spike
    assert spike_score([0, 2, 2.2], window=2, k=1) == 100.0
    assert spike_score([0, 2, -0.2], window=2, k=1) == 100.0
    # with the current point in its own window ([0, 2, 9]: std 3.86) 9 would not be a spike
    assert spike_score([0, 2, 9], window=2, k=2) == 100.0
    assert spike_score([5.0] * 30, window=10, k=7) == 0.0  # constant: nothing deviates


def test_no_full_window_is_nan_and_defaults_are_olmo2() -> None:
    assert math.isnan(spike_score([1.0, 2.0, 3.0], window=3))
    values = [1.0 + 0.01 * math.sin(i) for i in range(1200)]
    values[1100] = 50.0
    assert spike_score(values) == pytest.approx(100 / 200)  # window 1000, k 7


def test_matches_naive_loop_on_noisy_series() -> None:
    rng = random.Random(0)
    values = [rng.gauss(3.0, 0.2) for _ in range(600)]
    for i in (100, 250, 251, 400, 599):
        values[i] += rng.choice([-1, 1]) * rng.uniform(1.0, 4.0)
    for window, k in [(50, 3.0), (100, 7.0), (20, 2.5)]:
        assert spike_score(values, window, k) == pytest.approx(naive(values, window, k))


def test_rolling_in_pieces_equals_whole_series_and_drops_nonfinite() -> None:
    rng = random.Random(1)
    values = [rng.gauss(0, 1) + (8 if rng.random() < 0.03 else 0) for _ in range(500)]
    rolling = RollingSpikeScore(window=40, k=3.0)
    i = 0
    while i < len(values):
        n = rng.randint(1, 37)
        chunk = values[i : i + n]
        rolling.update([*chunk[:1], math.nan, *chunk[1:], math.inf])
        i += n
    assert rolling.score == pytest.approx(spike_score(values, 40, 3.0))
    assert len(rolling.history) == 40


def test_callback_logs_scores_and_restores_state() -> None:
    rng = random.Random(2)
    losses = [rng.gauss(5, 0.1) for _ in range(60)]
    grads = [rng.gauss(1, 0.05) for _ in range(60)]
    losses[33], grads[47], grads[50] = 9.0, 4.0, math.nan
    tr = fake_trainer(tiny_model(), log_every=10, steps=60)

    def feed(cb: SpikeScore, steps: range) -> dict:
        metrics: dict = {}
        for s in steps:
            metrics = {"loss": torch.tensor(losses[s - 1]), "grad_norm": torch.tensor(grads[s - 1])}
            cb.on_step_end(tr, s, metrics)
        return metrics

    cb = SpikeScore({"window": 20, "k": 4.0})
    first = feed(cb, range(1, 26))  # step 25 is not logged: the state holds it pending
    assert SPIKE_LOSS not in first
    restored = SpikeScore({"window": 20, "k": 4.0})
    restored.load_state_dict(cb.state_dict())
    last = feed(restored, range(26, 61))
    assert last[SPIKE_LOSS] == pytest.approx(spike_score(losses, 20, 4.0))
    finite_grads = [g for g in grads if math.isfinite(g)]
    assert last[SPIKE_GRAD] == pytest.approx(spike_score(finite_grads, 20, 4.0))
    assert last[SPIKE_GRAD] > 0 and last[SPIKE_LOSS] > 0
    assert last[NONFINITE] == 1.0


def test_bad_settings_are_config_errors() -> None:
    from normlab.launch.errors import ConfigError

    with pytest.raises(ConfigError, match="window"):
        SpikeScore({"window": 0})
    with pytest.raises(ConfigError, match="instruments.spike_score.windw"):
        SpikeScore({"windw": 10})


def direct_flags(x: np.ndarray, window: int, k: float) -> np.ndarray:
    """Each window's mean and population std straight from numpy, one window at a time."""
    out = []
    for t in range(window, len(x)):
        prev = x[t - window : t]
        dev = abs(x[t] - prev.mean())
        out.append(dev >= k * prev.std() and dev > 0)
    return np.array(out, dtype=bool)


def test_window_statistics_are_exact_next_to_a_huge_value() -> None:
    """One 1e8 in an N(1, 0.02) series: running sums would flag most of the next window (85 %
    on the old code); each window's own statistics flag only the 1e8 itself."""
    x = np.random.default_rng(0).normal(1.0, 0.02, 5000)
    x[2500] = 1e8
    mean, std = window_stats(x, 1000)
    windows = np.lib.stride_tricks.sliding_window_view(x[:-1], 1000)
    assert np.array_equal(mean, windows.mean(axis=1))
    assert np.array_equal(std, windows.std(axis=1))
    flags = spike_flags(x, 1000, 7.0)
    assert np.array_equal(flags, direct_flags(x, 1000, 7.0))
    assert np.flatnonzero(flags).tolist() == [2500 - 1000]  # no false spike
    assert spike_score(x, 1000, 7.0) == pytest.approx(100 / 4000)


def test_window_is_scaled_to_a_short_run() -> None:
    assert run_window(1000, 300) == 150 and run_window(1000, 2000) == 1000
    assert run_window(1000, 1500) == 750 and run_window(1000, 1) == 1
    rng = random.Random(3)
    losses = [rng.gauss(4, 0.05) for _ in range(300)]
    losses[200] = 9.0
    tr = fake_trainer(tiny_model(), log_every=100, steps=300)
    cb = SpikeScore()  # window 1000, k 7: scaled to 150 for this 300-step run
    cb.on_train_start(tr)
    logged = {}
    for s in range(1, 301):
        metrics = {"loss": torch.tensor(losses[s - 1]), "grad_norm": torch.tensor(1.0)}
        cb.on_step_end(tr, s, metrics)
        logged[s] = metrics
    assert SPIKE_LOSS not in logged[100]  # no point has a full window yet: not measured
    assert logged[300][SPIKE_WINDOW] == 150.0
    assert logged[300][SPIKE_LOSS] == pytest.approx(spike_score(losses, 150, 7.0))
    assert logged[300][SPIKE_LOSS] == pytest.approx(100 / 150)
    assert logged[300][SPIKE_GRAD] == 0.0
