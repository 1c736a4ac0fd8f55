"""instruments.kurtosis: the logged element and neuron-norm kurtosis equal their formulas over the
hooked block outputs, only on log steps; instruments.fp8 logs the same two numbers for the same
block outputs."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments.kurtosis import ActivationKurtosis

from tests.instrument_helpers import fake_trainer, tiny_model, train_step


def element_formula(x: torch.Tensor) -> float:
    """mean x^4 / (mean x^2)^2 over every entry (raw)."""
    x = x.double()
    return float(x.pow(4).mean() / x.pow(2).mean() ** 2)


def neuron_formula(x: torch.Tensor) -> float:
    """He et al.: s_j = RMS of neuron j over every token, mean s^4 / (mean s^2)^2."""
    s = x.double().reshape(-1, x.shape[-1]).pow(2).mean(0).sqrt()
    return float(s.pow(4).mean() / s.pow(2).mean() ** 2)


def capture_block_outputs(model: torch.nn.Module) -> tuple[dict[int, torch.Tensor], list]:
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        block.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o.detach()))
        for i, block in enumerate(model.blocks)
    ]
    return seen, hooks


def test_logged_on_log_steps_equal_to_the_formulas() -> None:
    model = tiny_model()
    trainer = fake_trainer(model, log_every=2)
    cb = ActivationKurtosis()
    cb.on_train_start(trainer)
    assert cb._handles == []  # step 1 is no log step: no hook runs in it
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(2))
    assert not any("kurtosis" in k for k in train_step(trainer, [cb], 1, tokens))
    seen, hooks = capture_block_outputs(model)
    metrics = train_step(trainer, [cb], 2, tokens)
    for h in hooks:
        h.remove()
    for i, x in seen.items():
        assert float(metrics[f"kurtosis/{i:02d}"]) == pytest.approx(element_formula(x), rel=1e-5)
        assert float(metrics[f"neuron_kurtosis/{i:02d}"]) == pytest.approx(
            neuron_formula(x), rel=1e-5
        )
    assert trainer.engine.reduced == ["sum"]  # one all-reduce per log step


def test_fp8_and_kurtosis_instruments_agree() -> None:
    pytest.importorskip("torchao")
    from normlab.launch.instruments.fp8 import FP8Stats

    model = tiny_model()
    trainer = fake_trainer(model, log_every=1)
    cbs = [ActivationKurtosis(), FP8Stats()]  # no precision.fp8: FP8Stats logs the kurtosis only
    for cb in cbs:
        cb.on_train_start(trainer)
    tokens = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(3))
    seen, hooks = capture_block_outputs(model)
    down_in: dict[int, torch.Tensor] = {}
    hooks += [
        b.mlp.branch.down_proj.register_forward_pre_hook(
            lambda m, a, i=i: down_in.__setitem__(i, a[0].detach())
        )
        for i, b in enumerate(model.blocks)
    ]
    metrics = train_step(trainer, cbs, 1, tokens)
    for h in hooks:
        h.remove()
    for i in range(len(model.blocks)):
        b = f"{i:02d}"
        assert float(metrics[f"kurtosis_resid/{b}"]) == float(metrics[f"kurtosis/{b}"])
        assert float(metrics[f"neuron_kurtosis_resid/{b}"]) == float(
            metrics[f"neuron_kurtosis/{b}"]
        )
        swiglu = down_in[i]
        assert float(metrics[f"kurtosis_swiglu/{b}"]) == pytest.approx(
            element_formula(swiglu), rel=1e-5
        )
        assert float(metrics[f"neuron_kurtosis_swiglu/{b}"]) == pytest.approx(
            neuron_formula(swiglu), rel=1e-5
        )
    for cb in cbs:
        cb.on_train_end(trainer, "completed")
