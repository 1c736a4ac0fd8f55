"""The attention probe (launch/instruments/attention_probe.py): the instruments that read a log
step's attention share one recomputation of S and P per training forward, and their logged
values are those each computed alone."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments import attention_probe
from normlab.launch.instruments.attention import AttentionLogits
from normlab.launch.instruments.attention_entropy import AttentionEntropy
from normlab.launch.instruments.stabilizers import AttentionStabilizers, lower_median
from normlab.model.attention import causal_max_logits
from normlab.model.attention_cores import attention_logits

from tests.instrument_helpers import fake_trainer, tiny_model, train_step

TOKENS = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(2))


def _logged(names: list[str], model_kw: dict) -> tuple[dict, int]:
    """Metrics of log step 2 with these instruments on, and how many times S was formed."""
    makers = {
        "attention_logits": lambda: AttentionLogits(True),
        "attn_entropy": lambda: AttentionEntropy(True),
        "attention_stabilizers": lambda: AttentionStabilizers(True),
    }
    torch.manual_seed(0)
    model = tiny_model(**model_kw)
    trainer = fake_trainer(model, log_every=2)
    cbs = [makers[n]() for n in names]
    for cb in cbs:
        cb.on_train_start(trainer)
    train_step(trainer, cbs, 1, TOKENS)
    calls = {"n": 0}
    original = attention_probe.attention_logits

    def counted(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return original(q, k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention_probe, "attention_logits", counted)
        metrics = train_step(trainer, cbs, 2, TOKENS)
    assert not any(p.readers or p.handle for p in attention_probe._PROBES.values() if
                   p.tap in {b.attn.branch.qk_tap for b in model.blocks})  # all unsubscribed
    return {k: float(v) for k, v in metrics.items() if "/" in k or k.startswith("max")}, calls["n"]


@pytest.mark.parametrize("model_kw", [{}, {"attn_softcap": 2.0}, {"attn_sinks": True}])
def test_shared_readers_log_what_each_logs_alone_from_one_recomputation(model_kw: dict) -> None:
    names = ["attention_logits", "attn_entropy", "attention_stabilizers"]
    together, formed = _logged(names, model_kw)
    assert formed == 3  # one S per block (tiny_model: 3 blocks), not one per instrument
    alone: dict = {}
    for name in names:
        metrics, n = _logged([name], model_kw)
        assert n == (0 if name == "attention_logits" else 3)  # the max logit alone streams
        alone.update(metrics)
    assert together.keys() == alone.keys() and len(together) > 10
    for key, value in alone.items():
        assert together[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_max_logits_from_s_equal_the_streamed_maximum() -> None:
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 300, 8, generator=g) * 3, torch.randn(2, 2, 300, 8, generator=g) * 3
    k_masked = k.clone()
    k_masked[:, :, 1:] = 0  # the future can not win: only row 0's own key is seen by row 0
    for kk in (k, k_masked):
        got = attention_probe.max_logits(q, kk, attention_logits(q, kk))
        torch.testing.assert_close(got, causal_max_logits(q, kk), rtol=1e-6, atol=1e-6)
        assert torch.equal(attention_probe.max_logits(q, kk, None), causal_max_logits(q, kk))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 1000, 1001])
def test_lower_median_is_torch_median(n: int) -> None:
    a = torch.rand(n, generator=torch.Generator().manual_seed(n))
    a[::3] = a[0]  # ties
    assert lower_median(a).item() == a.median().item()
