"""The t and noncentral-t functions the verdicts call directly (statistics.t_cdf, t_sf, t_ppf,
nct_sf) give scipy.stats' answers bit for bit, edges included (df <= 0 or nan, x = +-inf, q = 0
or 1): they only skip scipy.stats' per-call argument handling."""

import numpy as np
from normlab.launch.stats import statistics as st
from scipy import stats

DFS = np.array([np.nan, -1.0, 0.0, 0.5, 1.0, 2.0, 3.7, 9.0, 41.5, 198.0, 1e6, np.inf])
XS = np.array([-np.inf, -40.0, -2.5, -1e-3, 0.0, 0.7, 1.96, 12.0, np.inf, np.nan])
QS = np.array([0.0, 1e-12, 1e-4, 0.05, 0.5, 0.95, 0.9999, 1.0, 1.5, np.nan])


def same(a, b) -> bool:
    return np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_nan=True)


def test_t_functions_match_scipy_stats_on_a_grid_with_its_edges():
    x, df = np.meshgrid(XS, DFS)
    assert same(st.t_cdf(x, df), stats.t.cdf(x, df))
    assert same(st.t_sf(x, df), stats.t.sf(x, df))
    q, dq = np.meshgrid(QS, DFS)
    assert same(st.t_ppf(q, dq), stats.t.ppf(q, dq))


def test_scalars_give_the_same_numbers_as_scipy_stats():
    rng = np.random.default_rng(3)
    for _ in range(200):
        x, df, nc = rng.normal(0, 4), rng.uniform(0.5, 300), rng.normal(0, 6)
        assert float(st.t_cdf(x, df)) == float(stats.t.cdf(x, df))
        assert float(st.t_sf(x, df)) == float(stats.t.sf(x, df))
        q = rng.uniform()
        assert float(st.t_ppf(q, df)) == float(stats.t.ppf(q, df))
        assert float(st.nct_sf(x, df, nc)) == float(stats.nct.sf(x, df, nc))


def test_noncentral_t_survival_matches_scipy_stats_with_its_edges():
    for nc in (np.nan, -30.0, -1.0, 0.0, 0.4, 3.0, 25.0):
        x, df = np.meshgrid(XS, DFS)
        assert same(st.nct_sf(x, df, nc), stats.nct.sf(x, df, nc)), nc
