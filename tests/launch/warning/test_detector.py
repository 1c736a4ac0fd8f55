"""The robust z-score detector of SCIENCE.md 23.2: numbers against a direct computation, the
online form equal to the offline one, warm-up and level alarms."""

import math

import numpy as np
import pytest
from normlab.launch.warning.detector import RobustZ, Rule, alarms, ratios, zscores


def test_z_is_the_robust_score_of_log_x_against_the_previous_window():
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(0, 0.1, 300))
    z = zscores(x, window=100)
    assert np.isnan(z[:50]).all() and not np.isnan(z[50])  # scored from w/2 values on
    for t in (50, 120, 299):
        past = np.log(x[max(0, t - 100) : t])
        med = np.median(past)
        mad = np.median(np.abs(past - med))
        assert z[t] == pytest.approx((math.log(x[t]) - med) / (1.4826 * mad), rel=1e-12)


def test_online_detector_equals_offline_and_survives_a_checkpoint():
    rng = np.random.default_rng(1)
    x = np.exp(rng.normal(0, 0.2, 400))
    x[[200, 310]] = [20.0, math.nan]
    rule = Rule(level=2.0, level_is_ratio=True)
    offline = alarms(range(1, 401), x, rule, k=4.0, warmup_steps=60)
    det = RobustZ(rule, k=4.0, warmup_steps=60)
    online = [s for s, v in zip(range(1, 151), x[:150], strict=True) if det.update(s, v)]
    resumed = RobustZ(rule, k=4.0, warmup_steps=60)
    resumed.load_state_dict(det.state_dict())
    online += [s for s, v in zip(range(151, 401), x[150:], strict=True) if resumed.update(s, v)]
    assert online == offline and 201 in offline and all(s > 60 for s in offline)


def test_falling_signal_and_levels():
    x = [1.0 + 0.01 * (i % 7) for i in range(200)]
    x[150] = 0.5  # entropy collapse: a drop
    assert alarms(range(200), x, Rule(rising=False), k=6) == [150]
    assert alarms(range(200), x, Rule(), k=6) == []
    assert alarms(range(200), x, Rule(level=0.6, level_above=False), k=1e9) == [150]
    r = ratios([1.0] * 60 + [2.5], window=100)
    assert r[-1] == 2.5 and math.isnan(r[10])


def test_constant_window_scores_nothing():
    assert np.isnan(zscores([1.0] * 80 + [5.0])).all()
