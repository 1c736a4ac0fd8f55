"""AdamW parameter groups (no decay on norms, biases, embeddings) and the step itself."""

from __future__ import annotations

import torch
from normlab.launch.config import OptimSection
from normlab.launch.optim import build_optimizer, param_groups, set_lr
from normlab.model import ModelConfig, Transformer

SMALL = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=64, max_seq_len=16)


def _names(model: torch.nn.Module, group: dict) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_groups_exclude_norms_biases_and_embeddings() -> None:
    model = Transformer(ModelConfig(**SMALL, placement="peri", norm="layernorm", bias=True))
    decay, no_decay = param_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    dec, nodec = _names(model, decay), _names(model, no_decay)
    assert dec and nodec and not dec & nodec
    assert dec | nodec == {n for n, _ in model.named_parameters()}
    assert "embed.weight" in nodec and "head.weight" in dec
    for name, p in model.named_parameters():
        is_matrix = p.ndim == 2 and name != "embed.weight"
        assert (name in dec) == is_matrix, name
    assert any("norm" in n for n in nodec) and any(n.endswith(".bias") for n in nodec)


def test_tied_head_counts_as_embedding() -> None:
    model = Transformer(ModelConfig(**SMALL, tie_embeddings=True))
    decay, no_decay = param_groups(model, 0.1)
    assert "embed.weight" in _names(model, no_decay)
    assert all(p is not model.embed.weight for p in decay["params"])


def test_step_equals_torch_adamw() -> None:
    cfg = OptimSection(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(**SMALL))
    ref = Transformer(ModelConfig(**SMALL))
    ref.load_state_dict(ours.state_dict())
    opt = build_optimizer(ours, cfg)
    named = dict(ref.named_parameters())
    no_wd = [named[n] for n in named if named[n].ndim < 2 or n == "embed.weight"]
    wd = [named[n] for n in named if not (named[n].ndim < 2 or n == "embed.weight")]
    ref_opt = torch.optim.AdamW(
        [{"params": wd, "weight_decay": 0.1}, {"params": no_wd, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    tokens = torch.randint(0, 64, (2, 16))
    for mult in (1.0, 0.5, 0.25):
        set_lr(opt, 1e-2 * mult)
        for g in ref_opt.param_groups:
            g["lr"] = 1e-2 * mult
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            model(tokens).float().pow(2).mean().backward()
            o.step()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b), n
