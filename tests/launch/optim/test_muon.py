"""Muon (SCIENCE.md 6): parameter split, 10 steps against torch.optim.Muon + torch.optim.AdamW,
the `original` scale, Newton-Schulz singular values, and the start-up self-check refusing each
forced silent fallback (SGD, AdamW, shard-wise orthogonalisation)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from normlab.launch.config import OptimSection, RunConfig
from normlab.launch.engines.single import SingleEngine
from normlab.launch.optim import build_optimizer, set_lr
from normlab.launch.optim import muon as muon_mod
from normlab.launch.optim.muon import newton_schulz5
from normlab.launch.training.muon_selfcheck import (
    SelfCheckError,
    check_orthogonalised,
    probe_gradient,
)
from normlab.model import ModelConfig, Transformer

from tests.conftest import TESTS

SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=64, max_seq_len=16)
MUON = OptimSection(name="muon", lr=1e-2, weight_decay=0.1)


def _matrices(model: torch.nn.Module) -> set[str]:
    return {
        n
        for n, p in model.named_parameters()
        if p.ndim == 2 and n not in ("embed.weight", "head.weight")
    }


@pytest.mark.parametrize("tie", [False, True])
def test_split_sends_hidden_matrices_to_muon(tie: bool) -> None:
    model = Transformer(ModelConfig(**SMALL, bias=True, qk_norm="flat", tie_embeddings=tie))
    opt = build_optimizer(model, MUON)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.param_groups if g["use_muon"] for p in g["params"]}
    assert muon == _matrices(model)
    assert all(any(k in n for k in ("q_proj", "k_proj", "v_proj", "o_proj", "mlp")) for n in muon)
    adam = {names[id(p)] for g in opt.param_groups if not g["use_muon"] for p in g["params"]}
    assert adam == set(names.values()) - muon
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] for p in g["params"]}
    assert decayed == muon | ({"head.weight"} if not tie else set())


def _reference(model: torch.nn.Module, cfg: OptimSection, adjust: str):
    named = dict(model.named_parameters())
    mats = [named[n] for n in sorted(_matrices(model))]
    head = [named["head.weight"]]
    rest = [p for n, p in named.items() if p.ndim < 2 or n == "embed.weight"]
    muon = torch.optim.Muon(mats, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn=adjust)
    adamw = torch.optim.AdamW(
        [{"params": head, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
    )
    return muon, adamw


@pytest.mark.parametrize("scale", ["match_rms_adamw", "original"])
def test_ten_steps_equal_torch_muon_and_adamw(scale: str) -> None:
    cfg = dataclasses.replace(MUON, muon_scale=scale)
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(**SMALL, bias=True))
    ref = Transformer(ModelConfig(**SMALL, bias=True))
    ref.load_state_dict(ours.state_dict())
    opt = build_optimizer(ours, cfg)
    ref_opts = _reference(ref, cfg, scale)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    for step in range(10):
        mult = 1.0 - 0.05 * step  # a decaying schedule, through set_lr
        set_lr(opt, cfg.lr * mult)
        for o in ref_opts:
            for g in o.param_groups:
                g["lr"] = cfg.lr * mult
        for model, opts in ((ours, [opt]), (ref, ref_opts)):
            for o in opts:
                o.zero_grad()
            torch.nn.functional.cross_entropy(
                model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
            ).backward()
            for o in opts:
                o.step()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b), name  # the same operations in the same order: bit-identical
    torch.manual_seed(0)
    start = Transformer(ModelConfig(**SMALL, bias=True))
    pairs = zip(ours.parameters(), start.parameters(), strict=True)
    assert all(not torch.equal(a, b) for a, b in pairs)


def test_newton_schulz_singular_values_in_band() -> None:
    for rows, cols in ((32, 64), (64, 32), (48, 48)):
        sv = torch.linalg.svdvals(newton_schulz5(probe_gradient(rows, cols)).float())
        assert sv.min() > 0.6 and sv.max() < 1.2, (rows, cols, sv.aminmax())


def _engine() -> SingleEngine:
    engine = SingleEngine.for_run(RunConfig())
    engine._device = torch.device("cpu")
    return engine


def test_selfcheck_passes_on_the_real_muon() -> None:
    sv = check_orthogonalised(_engine(), partial(build_optimizer, cfg=MUON), "match_rms_adamw")
    assert sv.min() > 0.6 and sv.max() < 1.2 and sv.max() / sv.min() < 1.8


def _halves(directions: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Shard-wise orthogonalisation, as if each of 2 ranks orthogonalised its own rows."""
    return [torch.cat([newton_schulz5(h) for h in d.chunk(2)]) for d in directions]


@pytest.mark.parametrize("failure", ["sgd", "adamw", "shardwise"])
def test_selfcheck_refuses_a_silent_fallback(failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = MUON
    if failure == "sgd":  # Newton-Schulz skipped: momentum SGD
        monkeypatch.setattr(muon_mod, "newton_schulz5", lambda d, dtype=None: d)
    elif failure == "adamw":  # the factory quietly built AdamW
        cfg = dataclasses.replace(MUON, name="adamw")
    else:
        monkeypatch.setattr(muon_mod, "orthogonalise_all", _halves)
    with pytest.raises(SelfCheckError, match="singular values"):
        check_orthogonalised(_engine(), partial(build_optimizer, cfg=cfg), "match_rms_adamw")


@pytest.mark.distributed
def test_selfcheck_on_sharded_engines_passes_whole_and_refuses_each_fallback(
    tmp_path: Path,
) -> None:
    """2 gloo ranks, ZeRO 1, 2, 3 (the probe matrix is split between the ranks' partitions):
    normlab's Muon passes; skipped Newton-Schulz, shard-wise orthogonalisation and (ZeRO-3) the
    split reading the partitioned storage's shape instead of ds_shape are each refused. FSDP2
    (row shards of a DTensor): Muon passes; skipped Newton-Schulz, each rank orthogonalising its
    own rows and a factory that built AdamW are each refused."""
    from tests.dist_helpers import check_ok, env, free_port

    here = TESTS
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    out = tmp_path / "selfcheck.json"
    proc = subprocess.run(
        [*cmd, str(here / "dist_worker_muon_selfcheck.py"), str(out)],
        env={**env(), "PYTHONPATH": str(here.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    check_ok(proc)
    results = json.loads(out.read_text())
    for stage in (1, 2, 3):
        sv = torch.tensor(results[f"zero{stage}/muon"]["sv"])
        assert sv.min() > 0.6 and sv.max() < 1.2 and sv.max() / sv.min() < 1.8, (stage, sv)
        for failure in ("sgd", "shardwise", *(["zero_init_shape"] if stage == 3 else [])):
            refusal = results[f"zero{stage}/{failure}"].get("refused", "")
            assert "engine deepspeed" in refusal and "singular values" in refusal, (stage, failure)
    sv = torch.tensor(results["fsdp/muon"]["sv"])
    assert sv.min() > 0.6 and sv.max() < 1.2 and sv.max() / sv.min() < 1.8, sv
    for failure in ("sgd", "fsdp_shardwise", "adamw"):
        refusal = results[f"fsdp/{failure}"].get("refused", "")
        assert "engine fsdp" in refusal and "singular values" in refusal, (failure, results)
