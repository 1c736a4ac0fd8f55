"""Lead time, recall@k, false alarms and precision (SCIENCE.md 23.3) on runs with known alarms;
the Wilson interval against scipy's."""

import math

import pytest
from normlab.launch.warning.scoring import RunAlarms, episodes, horizon, score, wilson
from scipy.stats import binomtest


def test_horizon_and_episodes():
    assert horizon(1000) == 200 and horizon(50_000) == 2000
    assert episodes([10, 30, 59, 200, 249, 298, 348]) == [10, 200, 348]  # 50 apart: a new one


def test_known_leads_recall_false_alarms_precision():
    runs = [
        RunAlarms("a", 1000, 500, (100, 480, 490, 700)),  # lead 20; 100 false; 700 after t_E
        RunAlarms("b", 1000, 600, (598,)),  # lead 2
        RunAlarms("c", 1000, 800, (500,)),  # 500 < 800 - 200: false, the event missed
        RunAlarms("d", 1000, None, (10, 40, 400)),  # healthy: two false episodes
    ]
    s = score(runs)
    assert s.leads == (20.0, 2.0, None)
    assert [s.recall(k) for k in (1, 10, 50)] == [2 / 3, 1 / 3, 0.0]
    assert s.true_episodes == 2 and s.false_episodes == 4
    assert s.healthy_steps == 300 + 400 + 600 + 1000
    assert s.false_per_1000 == pytest.approx(1000 * 4 / 2300)
    assert s.precision == pytest.approx(2 / 6)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (7, 20), (20, 20), (1, 1)])
def test_wilson_matches_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(ref.low, abs=1e-12) and hi == pytest.approx(ref.high, abs=1e-12)
    assert all(math.isnan(v) for v in wilson(0, 0))
