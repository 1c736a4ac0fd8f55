"""instruments.qk_spectrum: the entropy against singular values of the full d x d bilinear form."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from normlab.launch.instruments.qk_spectrum import QKSpectrum, spectral_entropy

from tests.instrument_helpers import fake_trainer, tiny_model, train_step


def direct(wq: torch.Tensor, wk: torch.Tensor) -> float:
    s = torch.linalg.svdvals(wq.double().T @ wk.double())[: wq.shape[0]]  # rank <= d_h
    p = s / s.sum()
    return float(-(p * p.log()).sum())


def test_entropy_equals_the_full_form_and_its_limits():
    g = torch.Generator().manual_seed(0)
    wq, wk = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
    assert float(spectral_entropy(wq, wk)) == pytest.approx(direct(wq, wk), rel=1e-5)
    eye = torch.eye(8, 32)
    assert float(spectral_entropy(eye, eye)) == pytest.approx(math.log(8), rel=1e-6)  # flat
    rank1 = torch.zeros(8, 32)
    rank1[0, 0] = 3.0
    assert float(spectral_entropy(rank1 + 1e-9 * eye, eye)) == pytest.approx(0.0, abs=1e-5)


def test_logged_minimum_over_heads_with_grouped_keys():
    model = tiny_model(n_kv_heads=2)  # 4 query heads share 2 key heads
    trainer = fake_trainer(model, log_every=2)
    trainer.cfg.engine = SimpleNamespace(name="single", zero_stage=0)
    cb = QKSpectrum()
    cb.on_train_start(trainer)
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(1))
    assert "qk_entropy/00" not in train_step(trainer, [cb], 1, tokens)  # not a log step
    metrics = train_step(trainer, [cb], 2, tokens)
    att = model.blocks[2].attn.branch
    dh = att.head_dim
    q, k = att.q_proj.weight.detach(), att.k_proj.weight.detach()
    want = min(
        direct(q[h * dh : (h + 1) * dh], k[(h // 2) * dh : (h // 2 + 1) * dh]) for h in range(4)
    )
    assert float(metrics["qk_entropy/02"]) == pytest.approx(want, rel=1e-5)
