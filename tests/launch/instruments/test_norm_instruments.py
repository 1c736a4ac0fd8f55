"""The norm-stabilizer instrument against hand computations (mean |λ|, DyT/Derf α and s, the
saturation share), and the norm-side recipes training through the Trainer into `compare`."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments.common import block_key
from normlab.launch.instruments.norm_stabilizers import NormStabilizers
from normlab.model.norms import POINTWISE

from tests.instrument_helpers import fake_trainer, tiny_model, train_step

TOKENS = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("norm", ["dyt", "derf"])
def test_statistics_equal_hand_computation(norm: str) -> None:
    model = tiny_model(norm=norm, residual_scale="layerscale")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("alpha", "shift", "scale.weight")):
                p.normal_(0.0, 2.0)  # alphas far enough from 0.5 that some inputs saturate
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for i, block in enumerate(model.blocks):
        for sub in ("attn", "mlp"):
            handles.append(getattr(block, sub).norm_in.register_forward_hook(
                lambda m, a, o, key=f"{i:02d}/{sub}": seen.__setitem__(key, a[0].detach())))
    handles.append(model.final_norm.register_forward_hook(
        lambda m, a, o: seen.__setitem__("final", a[0].detach())))
    with torch.no_grad():
        model(TOKENS[:, :-1])  # the inputs of the step below (the weights do not change)
    for h in handles:
        h.remove()

    trainer = fake_trainer(model)
    cb = NormStabilizers(True)
    cb.on_train_start(trainer)
    metrics = train_step(trainer, [cb], 1, TOKENS)
    layers = {f"{i:02d}/{sub}": getattr(b, sub).norm_in
              for i, b in enumerate(model.blocks) for sub in ("attn", "mlp")}
    layers["final"] = model.final_norm
    assert all(isinstance(m, POINTWISE[norm]) for m in layers.values())
    shares = []
    for key, layer in layers.items():
        x = seen[key].double()
        a = layer.alpha.double()
        f = torch.tanh(a * x) if norm == "dyt" else torch.erf(a * x + layer.shift.double())
        share = (f.abs() >= 0.9).double().mean().item()
        shares.append(share)
        assert metrics[f"saturation/{key}"].item() == pytest.approx(share, abs=1e-6), key
        assert metrics[f"pointwise_alpha/{key}"].item() == pytest.approx(layer.alpha.item())
        if norm == "derf":
            assert metrics[f"pointwise_shift/{key}"].item() == pytest.approx(layer.shift.item())
        else:
            assert f"pointwise_shift/{key}" not in metrics
    assert any(0 < s < 1 for s in shares)  # the statistic is not trivially 0 or 1 here
    for i, block in enumerate(model.blocks):
        for sub in ("attn", "mlp"):
            lam = getattr(block, sub).scale.weight
            got = metrics[block_key("residual_scale", i, sub)].item()
            assert got == pytest.approx(lam.abs().mean().item(), rel=1e-6)
    later = train_step(trainer, [cb], 2, TOKENS)  # hooks were removed and re-armed: one step's
    assert later["saturation/final"].item() == pytest.approx(  # counts, not two
        metrics["saturation/final"].item(), abs=0.05)


def test_norm_recipes_train_and_compare_shows_them(tiny_data, tmp_path) -> None:
    """The norm-side recipes train on the prepared corpus through the Trainer, log their
    statistics, and `compare` shows them with the placement label naming the switches."""
    from normlab.launch.config import load_config
    from normlab.launch.report.compare import compare
    from normlab.launch.training.trainer import Trainer
    from rich.console import Console

    from tests.conftest import REPO, tiny_overrides

    runs = []
    for name in ("layerscale", "dyt", "derf", "hybrid_star", "keel"):
        run = tmp_path / name
        over = tiny_overrides(tiny_data, run, **{"training.steps": 4})
        cfg = load_config(REPO / "recipes" / f"{name}.yaml", over + ["training.threads=1"])
        assert Trainer(cfg).run() == 0
        runs.append(run)
    console = Console(record=True, width=400)
    rows = compare([str(r) for r in runs], None, console=console)["rows"]
    by = {r["recipe"]: r for r in rows}
    assert 0 < by["layerscale"]["residual_scale"] < 1 and by["dyt"]["residual_scale"] is None
    assert 0 < by["dyt"]["pointwise_alpha"] < 1 and 0 <= by["derf"]["saturation"] < 1
    assert by["keel"]["pointwise_alpha"] is None and by["keel"]["placement"] == "keel"
    assert by["dyt"]["placement"] == "pre+dyt"
    assert by["layerscale"]["placement"] == "pre+layerscale"
    assert by["hybrid_star"]["placement"] == "hybrid_star+qk_norm:head"
    text = console.export_text()
    assert "mean |λ|" in text and "DyT/Derf α" in text and "saturation" in text
