"""instruments.kurtosis against a two-pass computation over the hooked block outputs."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments.kurtosis import ActivationKurtosis, kurtosis_from_sums

from tests.instrument_helpers import fake_trainer, tiny_model, train_step


def two_pass(x: torch.Tensor) -> float:
    x = x.double().flatten()
    d = x - x.mean()
    return float(d.pow(4).mean() / d.pow(2).mean() ** 2)


def test_power_sums_give_the_two_pass_kurtosis_even_off_centre():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=g, dtype=torch.float64) * 0.5 + 3.0
    x[:5] += 40.0  # outliers
    sums = torch.stack([torch.tensor(float(x.numel()))] + [x.pow(k).sum() for k in range(1, 5)])
    assert float(kurtosis_from_sums(sums)) == pytest.approx(two_pass(x), rel=1e-9)


def test_logged_on_log_steps_equal_to_the_block_outputs():
    model = tiny_model()
    trainer = fake_trainer(model, log_every=2)
    cb = ActivationKurtosis()
    cb.on_train_start(trainer)
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(2))
    assert "kurtosis/00" not in train_step(trainer, [cb], 1, tokens)
    seen = {}
    hook = model.blocks[1].register_forward_hook(lambda m, a, o: seen.__setitem__("x", o.detach()))
    metrics = train_step(trainer, [cb], 2, tokens)
    hook.remove()
    assert float(metrics["kurtosis/01"]) == pytest.approx(two_pass(seen["x"]), rel=1e-5)
