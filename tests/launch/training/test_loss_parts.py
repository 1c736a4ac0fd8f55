"""Cross-entropy and z-loss apart (issue 11): the engine reports each term of the objective, the
trainer logs `loss` = cross-entropy and `z_loss` beside it, evaluation is cross-entropy only, and
the loss spike score is computed on the cross-entropy."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from normlab.launch.config import load_config
from normlab.launch.engines.single import SingleEngine
from normlab.launch.instruments import spike_score
from normlab.launch.optim import build_optimizer
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

Z = 1e-2


def test_engine_reports_ce_and_z_apart_and_eval_is_ce(tiny_data: Path, tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "recipes" / "pre.yaml", tiny_overrides(tiny_data, tmp_path, optim__z_loss=Z)
    )
    engine = SingleEngine.for_run(cfg)
    engine.setup(cfg.model_config(), partial(build_optimizer, cfg=cfg.optim))
    tokens = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss = engine.forward_backward(inputs, targets)
    parts = engine.pop_loss_parts(loss)
    with torch.no_grad():  # the same weights (no step yet), the formula of SCIENCE.md section 5
        logits = engine.model(inputs).double().reshape(-1, 512)
    ce = F.cross_entropy(logits, targets.reshape(-1))
    z = Z * torch.logsumexp(logits, dim=-1).pow(2).mean()
    assert float(parts["ce"]) == pytest.approx(float(ce), rel=1e-5)
    assert float(parts["z"]) == pytest.approx(float(z), rel=1e-5)
    assert float(loss) == pytest.approx(float(ce + z), rel=1e-5)
    assert float(engine.eval_loss(inputs, targets)) == pytest.approx(float(ce), rel=1e-5)
    assert engine.pop_loss_parts(loss) == {"ce": loss}  # popped: nothing left for the next step


def test_trainer_logs_cross_entropy_and_z_loss_apart(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    rows = {}
    for coef in (0.0, Z):
        run = tmp_path / f"z{coef}"
        overrides = tiny_overrides(
            tiny_data, run, optim__z_loss=coef, training__steps=4, checkpoint__every=0
        )
        assert Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides)).run() == 0
        rows[coef] = read_jsonl(run / "metrics.jsonl")
    train = {c: [r for r in rows[c] if "loss" in r] for c in rows}
    # step 1 runs the same weights on the same batch: the cross-entropy is the same number
    assert train[Z][0]["loss"] == train[0.0][0]["loss"]
    assert "z_loss" not in train[0.0][0] and all(r["z_loss"] > 0 for r in train[Z])
    # the loss spike score is over the logged cross-entropy (window scaled to 4 // 2 = 2)
    ce = [r["loss"] for r in train[Z]]
    assert train[Z][-1]["spike_score/window"] == 2
    assert train[Z][-1]["spike_score/loss"] == pytest.approx(spike_score(ce, 2, 7.0))
