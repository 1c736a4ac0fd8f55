"""The two outlier-kurtosis estimators (launch/instruments/outlier_kurtosis.py) against closed
forms on synthetic activations: an outlier channel, a massive token, a Gaussian, a constant.

With every entry +-1 except one line of +-a (random signs: only magnitudes enter):
- an outlier channel (column j of +-a): s_j^2 = a^2, every other s^2 = 1, so
  neuron-norm = d (d - 1 + a^4) / (d - 1 + a^2)^2, and the element kurtosis is the same number
  (each column's entries share one magnitude);
- a massive token (row of +-a): every s^2 = (n - 1 + a^2) / n, so neuron-norm = 1 exactly, while
  the element kurtosis is n (n - 1 + a^4) / (n - 1 + a^2)^2.
"""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments.outlier_kurtosis import (
    element_kurtosis,
    moment_sums,
    neuron_norm_kurtosis,
    neuron_norm_kurtosis_from_sums,
)

N_TOKENS, WIDTH, A = 128, 64, 16.0


def signs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, shape, generator=g).double() * 2 - 1


def line_ratio(m: int, a: float) -> float:
    """m (m - 1 + a^4) / (m - 1 + a^2)^2: one of m equal-weight lines carries a^2 instead of 1."""
    return m * (m - 1 + a**4) / (m - 1 + a**2) ** 2


def test_an_outlier_channel_raises_both() -> None:
    x = signs(N_TOKENS, WIDTH)
    x[:, 5] *= A
    want = line_ratio(WIDTH, A)  # 41.26 for d = 64, a = 16
    assert float(neuron_norm_kurtosis(x)) == pytest.approx(want, rel=1e-12)
    assert float(element_kurtosis(x)) == pytest.approx(want, rel=1e-12)
    assert want > 40


def test_a_massive_token_raises_only_the_element_kurtosis() -> None:
    x = signs(N_TOKENS, WIDTH, seed=1)
    x[7] *= A
    assert float(neuron_norm_kurtosis(x)) == pytest.approx(1.0, abs=1e-12)  # the minimum
    assert float(element_kurtosis(x)) == pytest.approx(line_ratio(N_TOKENS, A), rel=1e-12)
    assert line_ratio(N_TOKENS, A) > 50


def test_leading_dims_are_tokens_and_sums_add_across_micro_batches() -> None:
    x = signs(4, 32, WIDTH, seed=2) * torch.rand(4, 32, WIDTH, dtype=torch.float64)
    x[..., 3] *= 9.0
    flat = x.reshape(-1, WIDTH)
    assert float(neuron_norm_kurtosis(x)) == pytest.approx(float(neuron_norm_kurtosis(flat)))
    halves = moment_sums(x[:2]) + moment_sums(x[2:])  # two micro-batches, or two ranks
    assert float(neuron_norm_kurtosis_from_sums(halves)) == pytest.approx(
        float(neuron_norm_kurtosis(x)), rel=1e-12
    )


def test_against_the_definition_and_the_authors_logged_variance() -> None:
    """s_j = RMS of neuron j over the tokens, Kurt = m4(s) / m2(s)^2 computed directly; He et
    al.'s code logs the variance over neurons of s_j^2 / mean(s^2), which is Kurt - 1."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, WIDTH, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, WIDTH)
    s = x.pow(2).mean(0).sqrt()
    kurt = s.pow(4).mean() / s.pow(2).mean() ** 2
    assert float(neuron_norm_kurtosis(x)) == pytest.approx(float(kurt), rel=1e-12)
    feat = s.pow(2) / x.pow(2).mean()
    assert float(feat.var(unbiased=False)) == pytest.approx(float(kurt) - 1, rel=1e-10)


def test_gaussian_values() -> None:
    """iid N(0, 1): the element kurtosis is 3; each s_j^2 is chi2_n / n, so the neuron-norm
    kurtosis is 1 + var(s^2) = 1 + 2/n in expectation (over d = 64 neurons its relative spread
    is about sqrt(2/63) = 18 %)."""
    n = 1024
    x = torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert float(element_kurtosis(x)) == pytest.approx(3.0, abs=0.15)  # sd about 0.04
    excess = float(neuron_norm_kurtosis(x)) - 1
    assert 0.5 * 2 / n < excess < 1.5 * 2 / n


def test_raw_not_centred() -> None:
    """The element kurtosis is about zero: a constant is 1 (centred: 0/0) and a stream with a
    mean far above its spread is near 1 (centred: 3)."""
    assert float(element_kurtosis(torch.full((8, 4), -2.5))) == pytest.approx(1.0, abs=1e-15)
    g = torch.Generator().manual_seed(5)
    x = 10.0 + torch.randn(4096, 8, generator=g, dtype=torch.float64)
    mu4, mu2 = 10.0**4 + 6 * 10.0**2 + 3, 10.0**2 + 1  # E x^4, E x^2 of N(10, 1)
    assert float(element_kurtosis(x)) == pytest.approx(mu4 / mu2**2, abs=2e-3)  # 1.039
