"""instruments.attn_entropy against the entropies of attention probabilities written out directly
from the tapped q and k (float64, the causal mask, the soft-cap and the sink column by hand)."""

from __future__ import annotations

import math

import pytest
import torch
from normlab.launch.instruments.attention_entropy import AttentionEntropy, row_entropy
from normlab.launch.warning.signals import SIGNALS

from tests.instrument_helpers import fake_trainer, tiny_model, train_step

VARIANTS = {
    "sdpa": {},
    "gqa": {"n_kv_heads": 2},
    "softcap": {"attn_softcap": 2.0},  # below the logits' range: the cap binds
    "sinks": {"attn_sinks": True},
}


def direct_entropy(q: torch.Tensor, k: torch.Tensor, cap: float | None, sinks) -> torch.Tensor:
    """(heads,) mean over (batch, rows) of -sum p log p, everything written out in float64."""
    q, k = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    t = s.shape[-1]
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    if sinks is not None:
        col = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    h = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # 0 log 0 = 0
    return h.mean(dim=(0, 2))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logged_minimum_over_heads_equals_the_direct_entropy(variant: str) -> None:
    model = tiny_model(**VARIANTS[variant])
    if variant == "sinks":  # learned sink logits away from their zero init
        for b in model.blocks:
            b.attn.branch.core.sinks.data.normal_(generator=torch.Generator().manual_seed(3))
    trainer = fake_trainer(model, log_every=2)
    cb = AttentionEntropy(True)
    cb.on_train_start(trainer)
    tokens = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(2))
    assert not any(k.startswith("attn_entropy") for k in train_step(trainer, [cb], 1, tokens))
    assert cb._handles  # step 2 is a log step: armed at the end of step 1
    seen: list = []
    att = model.blocks[1].attn.branch
    hook = att.qk_tap.register_forward_hook(lambda m, a, out: seen.append(out))
    metrics = train_step(trainer, [cb], 2, tokens)
    hook.remove()
    ((q, k),) = seen
    cap = VARIANTS[variant].get("attn_softcap")
    sinks = att.core.sinks.detach() if variant == "sinks" else None
    want = direct_entropy(q.detach(), k.detach(), cap, sinks)
    assert float(metrics["attn_entropy/01"]) == pytest.approx(float(want.min()), rel=1e-5)
    assert not cb._handles  # step 3 does not log: nothing stays hooked


def test_uniform_attention_has_the_mean_of_log_row_lengths() -> None:
    """q = 0: every row attends uniformly over its r + 1 keys, H_r = log(r + 1)."""
    t = 9
    p = torch.softmax(torch.zeros(t, t).masked_fill(torch.ones(t, t).bool().triu(1), -math.inf), -1)
    assert row_entropy(p).tolist() == pytest.approx([math.log(r + 1) for r in range(t)], abs=1e-6)


def test_the_warnings_signal_scores_a_drop() -> None:
    s = SIGNALS["attn_entropy"]
    assert s.key == "attn_entropy" and s.per_block and s.rule.rising is False
