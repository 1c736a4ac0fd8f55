"""`apply_transforms`: the one order every engine uses (FP8, then activation checkpointing, then
compile), checked on the module structure it leaves, and the model it returns still computes the
untransformed model's logits."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.config import EngineSection, FP8Section
from normlab.launch.engines.transforms import apply_transforms
from normlab.model import ModelConfig, Transformer
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)


def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG)


def test_checkpointing_wraps_each_block_around_its_fp8_layers() -> None:
    pytest.importorskip("torchao")
    m = model()
    out = apply_transforms(m, EngineSection(activation_checkpointing=True), FP8Section(), "cpu")
    assert out is m
    from torchao.float8.float8_linear import Float8Linear

    for block in m.blocks:
        assert isinstance(block, CheckpointWrapper)  # AC after FP8: it wraps converted layers
        inner = [x for x in block.modules() if isinstance(x, Float8Linear)]
        assert inner, "FP8 conversion ran before activation checkpointing"
    assert not isinstance(m.head, Float8Linear)  # keep: [head]


def test_compile_is_per_block_or_of_the_whole_model() -> None:
    section = EngineSection(compile=True, compile_backend="eager")
    m = model()
    assert apply_transforms(m, section, None, "cpu") is m
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in m.blocks)
    whole = model()
    compiled = apply_transforms(whole, section, None, "cpu", whole_model=True)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled._orig_mod is whole
    x = torch.randint(0, CFG.vocab_size, (2, 8))
    torch.testing.assert_close(compiled(x), model()(x))  # same weights (seed 0), same logits


def test_nothing_configured_leaves_the_model_as_built() -> None:
    m, ref = model(), model()
    assert apply_transforms(m, EngineSection(), None, "cpu") is m
    x = torch.randint(0, CFG.vocab_size, (2, 8))
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)
