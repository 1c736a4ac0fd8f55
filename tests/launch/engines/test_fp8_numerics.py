"""precision.fp8 numerics on CPU (emulated): normlab's conversion equals torchao's own
Float8Linear on the same weights bit for bit, and stays within torchao's SQNR thresholds of the
unconverted model (pytorch/ao test/float8/test_base.py, `_test_linear_impl`: output >= 18 dB,
weight gradient >= 17 dB). Smooth-SwiGLU is SwiGLU bit for bit without FP8."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from normlab.launch.config.schema import FP8Section
from normlab.launch.engines.fp8 import convert_fp8, float8_linears, fp8_targets
from normlab.model import ModelConfig, Transformer
from normlab.model.mlp import channel_scale
from torch import nn

torchao = pytest.importorskip("torchao")
from torchao.float8 import Float8LinearConfig  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402
from torchao.float8.float8_utils import compute_error  # noqa: E402

RECIPES = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]
SQNR_OUT, SQNR_GRAD = 18.0, 17.0  # torchao's thresholds for one Float8Linear


def _model(**kw: object) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=128, **kw)
    return Transformer(cfg)


def _torchao_reference(model: nn.Module, recipe: str, names: list[str]) -> nn.Module:
    """`model` with each named linear replaced by torchao's Float8Linear.from_float."""
    ref = copy.deepcopy(model)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = ref.get_submodule(parent)
        setattr(owner, child, Float8Linear.from_float(getattr(owner, child), config=config))
    return ref


def _fwd_bwd(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("recipe", RECIPES)
def test_conversion_equals_torchaos_float8linear_exactly(recipe: str) -> None:
    model = _model()
    ours = copy.deepcopy(model)
    n = convert_fp8(ours, FP8Section(recipe=recipe), "cpu")
    names, _ = fp8_targets(model, ["head"])
    assert n == len(names) == 2 * 7  # q, k, v, o, gate, up, down per block
    assert [name for name, _ in float8_linears(ours)] == names
    assert type(ours.head) is nn.Linear  # the output head stays in high precision
    ref = _torchao_reference(model, recipe, names)
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    out, grads = _fwd_bwd(ours, tokens)
    ref_out, ref_grads = _fwd_bwd(ref, tokens)
    assert torch.equal(out, ref_out)
    for name, g in grads.items():
        assert torch.equal(g, ref_grads[name]), name


@pytest.mark.parametrize("recipe", RECIPES)
def test_within_torchaos_sqnr_of_the_unconverted_model(recipe: str) -> None:
    model = _model()
    fp8 = copy.deepcopy(model)
    convert_fp8(fp8, FP8Section(recipe=recipe), "cpu")
    tokens = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(2))
    out, grads = _fwd_bwd(model, tokens)
    fp8_out, fp8_grads = _fwd_bwd(fp8, tokens)
    assert compute_error(out, fp8_out) >= SQNR_OUT
    for name, _ in float8_linears(fp8):
        key = f"{name}.weight"
        assert compute_error(grads[key], fp8_grads[key]) >= SQNR_GRAD, key
    assert not torch.equal(out, fp8_out)  # the casts are real


def test_smooth_swiglu_is_swiglu_bit_for_bit_without_fp8() -> None:
    plain, smooth = _model(), _model(smooth_swiglu=True)
    smooth.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(3))
    out, grads = _fwd_bwd(plain, tokens)
    s_out, s_grads = _fwd_bwd(smooth, tokens)
    assert torch.equal(out, s_out)
    for name, g in grads.items():
        assert torch.equal(g, s_grads[name]), name


def test_channel_scale_puts_each_channel_absmax_in_one_to_two() -> None:
    h = torch.randn(3, 5, 8) * torch.logspace(-3, 3, 8)  # channels of very different size
    h[..., 2] = 0.0
    s = channel_scale(h)
    amax = (h * s).abs().amax(dim=(0, 1))
    assert torch.equal(torch.log2(s), torch.log2(s).round())  # powers of two
    assert s[2] == 1.0 and amax[2] == 0.0
    live = amax[amax > 0]
    assert bool(((live >= 1) & (live < 2)).all())


def test_smooth_swiglu_changes_the_fp8_cast_of_the_down_projection() -> None:
    """Under FP8 the smoothed model differs from the plain one (the scale acts on the cast) and
    stays within torchao's SQNR of the unconverted model."""
    plain, smooth = _model(), _model(smooth_swiglu=True)
    smooth.load_state_dict(plain.state_dict())
    reference = copy.deepcopy(plain)
    convert_fp8(plain, FP8Section(), "cpu")
    convert_fp8(smooth, FP8Section(), "cpu", smooth=True)
    tokens = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(4))
    ref_out, _ = _fwd_bwd(reference, tokens)
    p_out, _ = _fwd_bwd(plain, tokens)
    s_out, _ = _fwd_bwd(smooth, tokens)
    assert not torch.equal(p_out, s_out)
    assert compute_error(ref_out, s_out) >= SQNR_OUT
