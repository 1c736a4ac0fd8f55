"""instruments.adam_state (issue 32 item 2): each statistic against a direct computation over the
block's flattened AdamW state; nothing on steps that do not log."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from normlab.launch.instruments.adam_state import AdamState
from normlab.launch.metric_keys import block_key

from tests.instrument_helpers import fake_trainer, tiny_model, train_step


class Before:
    """The gradients and first moments of block 1 just before the step."""

    name = "before"

    def on_after_backward(self, trainer, step):
        params = list(trainer.engine.model.blocks[1].parameters())
        opt = trainer.engine.optimizer
        self.g = torch.cat([p.grad.flatten() for p in params])
        self.m = torch.cat(
            [opt.state[p]["exp_avg"].flatten() if p in opt.state else torch.zeros(p.numel())
             for p in params]
        )  # fmt: skip

    def on_step_end(self, trainer, step, metrics):
        pass


def test_statistics_equal_a_direct_computation():
    model = tiny_model()
    eps = 1e-6
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=eps)
    trainer = fake_trainer(model, log_every=3, steps=9)
    trainer.engine.optimizer = opt
    trainer.cfg.engine = SimpleNamespace(name="single")
    cb, before = AdamState(), Before()
    cb.on_train_start(trainer)
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(0))
    for step in range(1, 7):
        metrics = train_step(trainer, [before, cb], step, tokens, opt)
        if step % 3:
            assert not any(k.startswith("adam_") for k in metrics)  # not a log step
    params = list(model.blocks[1].parameters())
    m = torch.cat([opt.state[p]["exp_avg"].flatten() for p in params])
    v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in params])
    t = 6
    root = (v / (1 - 0.95**t)).sqrt()
    u = (m / (1 - 0.9**t)) / (root + eps)
    got = {k: float(v) for k, v in metrics.items() if k.endswith("/01")}
    assert got[block_key("adam_update_rms", 1)] == pytest.approx(
        float(u.pow(2).mean().sqrt()), rel=1e-5
    )
    assert got[block_key("adam_m_norm", 1)] == pytest.approx(float(m.norm()), rel=1e-5)
    assert got[block_key("adam_v_norm", 1)] == pytest.approx(float(v.sqrt().norm()), rel=1e-5)
    assert got[block_key("eps_floor", 1)] == pytest.approx(float((root < 10 * eps).float().mean()))
    cos = F.cosine_similarity(before.g, before.m, dim=0)
    assert got[block_key("grad_mom_cos", 1)] == pytest.approx(float(cos), rel=1e-4)
    assert float(metrics["head_norm"]) == pytest.approx(
        float(model.head.weight.detach().norm()), rel=1e-6
    )


def test_fused_moment_sums_equal_each_part_computed_alone():
    """_moment_sums over parts with their own step, betas and eps (and coordinates on both sides
    of the 10 eps floor, one exactly on it: not below) equals the per-part formulas summed."""
    from normlab.launch.engines.storage import AdamPart
    from normlab.launch.instruments.adam_state import FLOOR, _moment_sums

    g = torch.Generator().manual_seed(4)
    parts = []
    for n, step, betas, eps in [(50, 3.0, (0.9, 0.95), 1e-8), (7, 10.0, (0.8, 0.99), 1e-3)]:
        m = torch.randn(n, generator=g)
        v = torch.rand(n, generator=g) * 1e-4
        bc2 = 1 - betas[1] ** step
        v[:3] = torch.tensor([FLOOR * eps / 2, FLOOR * eps, FLOOR * eps * 2]).square() * bc2
        parts.append(AdamPart(m, v, step, betas, eps, False))
    want = torch.zeros(5, dtype=torch.float64)
    for p in parts:
        root = (p.v.double() / (1 - p.betas[1] ** p.step)).sqrt()
        u = (p.m.double() / (1 - p.betas[0] ** p.step)) / (root + p.eps)
        root32 = (p.v / (1 - p.betas[1] ** p.step)).sqrt()  # the floor test in the state's fp32
        floor = (root32 < FLOOR * p.eps).sum()
        want += torch.tensor([u.square().sum(), p.m.numel(), p.m.double().square().sum(),
                              p.v.double().sum(), floor])  # fmt: skip
    got = _moment_sums(parts).double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    assert 2 <= got[4] <= 4  # the crafted coordinates: one below per part (and random others)
