"""The attention-stabilizer instrument against hand computations: the first-token share, the sink
mass, the gate mean and histogram, the attention and output cap shares, massive activations."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.instruments.common import block_key
from normlab.launch.instruments.stabilizers import AttentionStabilizers
from normlab.model.attention_cores import attention_logits

from tests.instrument_helpers import fake_trainer, tiny_model, train_step

TOKENS = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))


def _observed(model) -> list[dict[str, torch.Tensor]]:
    """Per block: the attention input x, q, k after QK-norm and RoPE, and the block output; in
    block 0's entry also the head's logits before the final cap."""
    seen: list[dict[str, torch.Tensor]] = [{} for _ in model.blocks]
    handles = []
    for i, block in enumerate(model.blocks):
        att = block.attn.branch

        def core_hook(mod, args, out, i=i):
            seen[i]["q"], seen[i]["k"] = args[0].detach(), args[1].detach()

        def gate_hook(mod, args, out, i=i):
            seen[i]["x"] = args[0].detach()

        def block_hook(mod, args, out, i=i):
            seen[i]["out"] = out.detach()

        handles += [att.core.register_forward_hook(core_hook),
                    att.gate.register_forward_hook(gate_hook),
                    block.register_forward_hook(block_hook)]
    def cap_hook(mod, args, out):
        seen[0]["head"] = args[0].detach()

    handles.append(model.final_cap.register_forward_hook(cap_hook))
    with torch.no_grad():
        model(TOKENS[:, :-1])
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("kw", [
    dict(attn_gate="elementwise", attn_sinks=True, attn_softcap=1.0, final_softcap=2.0),
    dict(attn_gate="headwise"),
    dict(),
])
def test_stabilizer_statistics_equal_hand_computation(kw) -> None:
    model = tiny_model(**kw)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # larger logits so the caps bind
        if kw.get("attn_sinks"):
            for block in model.blocks:
                block.attn.branch.core.sinks.normal_(0.0, 1.0)
    seen = _observed(model)
    tr = fake_trainer(model)
    cb = AttentionStabilizers()
    cb.on_train_start(tr)
    metrics = train_step(tr, [cb], 1, TOKENS)
    for i, block in enumerate(model.blocks):
        att = block.attn.branch
        s = attention_logits(seen[i]["q"], seen[i]["k"]).double()
        T = s.shape[-1]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        capped = att.core.cap * torch.tanh(s / att.core.cap) if att.core.cap else s
        logits = capped.masked_fill(future, float("-inf"))
        if kw.get("attn_sinks"):  # p = exp(S) / (exp(s_h) + sum exp(S))
            sink = att.core.sinks.detach().double().view(1, -1, 1, 1)
            e = torch.exp(logits)
            p = e / (torch.exp(sink) + e.sum(-1, keepdim=True))
            assert float(metrics[block_key("sink_mass", i)]) == pytest.approx(
                float((1 - p.sum(-1)).mean()), rel=1e-4)
            for h in range(p.shape[1]):
                assert float(metrics[block_key("sink_logit", i, f"h{h}")]) == pytest.approx(
                    float(sink.flatten()[h]))
        else:
            p = torch.softmax(logits, -1)
        assert float(metrics[block_key("first_token_share", i)]) == pytest.approx(
            float(p[:, :, 1:, 0].mean()), rel=1e-4)
        if att.core.cap:
            seen_logits = s[:, :, ~future]
            share = float((seen_logits.abs() >= att.core.cap).double().mean())
            assert 0 < share < 1
            assert float(metrics[block_key("attn_cap_share", i)]) == pytest.approx(share, rel=1e-6)
        if kw.get("attn_gate"):
            g = att.gate.gate(seen[i]["x"]).double()
            assert float(metrics[block_key("gate_mean", i)]) == pytest.approx(float(g.mean()))
            hist = [float(metrics[block_key("gate_hist", i, f"b{b}")]) for b in range(10)]
            assert sum(hist) == pytest.approx(1.0)
            ref = torch.histc(g.float(), bins=10, min=0, max=1) / g.numel()
            assert hist == pytest.approx(ref.tolist(), abs=1e-6)
        a = seen[i]["out"].abs().flatten()
        assert float(metrics[block_key("massive_act", i)]) == pytest.approx(
            float(a.max() / a.median()), rel=1e-5)
    if kw.get("final_softcap"):
        z, cap = seen[0]["head"], kw["final_softcap"]  # the logits before the cap
        share = float((z.abs() >= cap).double().mean())
        assert 0 < share < 1
        assert float(metrics["final_cap_share"]) == pytest.approx(share)
        assert float(metrics["final_cap_ratio"]) == pytest.approx(float(z.abs().max() / cap))
    else:
        assert "final_cap_share" not in metrics and "sink_mass/00" not in metrics


def test_stabilizer_recipes_train_and_compare_shows_them(tiny_data, tmp_path) -> None:
    """Every stabilizer recipe trains on the prepared corpus through the Trainer, logs its
    statistics, and `compare` shows them with the placement label naming the switches."""
    from normlab.launch.config import load_config
    from normlab.launch.report.compare import compare
    from normlab.launch.training.trainer import Trainer
    from rich.console import Console

    from tests.conftest import REPO, tiny_overrides

    runs = []
    for name in ("gated_qwen3_next", "sinks", "softcap"):
        run = tmp_path / name
        cfg = load_config(REPO / "recipes" / f"{name}.yaml",
                          tiny_overrides(tiny_data, run, **{"training.steps": 4}))
        assert Trainer(cfg).run() == 0
        runs.append(run)
    console = Console(record=True, width=400)
    rows = compare([str(r) for r in runs], None, console=console)["rows"]
    by = {r["recipe"]: r for r in rows}
    assert 0 < by["gated_qwen3_next"]["gate_mean"] < 1 and by["sinks"]["gate_mean"] is None
    assert 0 < by["sinks"]["sink_mass"] < 1 and by["softcap"]["sink_mass"] is None
    assert by["softcap"]["final_cap_share"] is not None
    assert all(0 < r["first_token_share"] <= 1 and r["massive_act"] > 1 for r in rows)
    assert by["softcap"]["placement"] == "pre+softcap:50/30"
    assert "gate:elementwise" in by["gated_qwen3_next"]["placement"]
    assert "sink mass" in console.export_text()
