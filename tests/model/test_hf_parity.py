"""Logits agree with HF transformers after weight conversion, both directions (fp32, <= 1e-4)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from normlab.model import ModelConfig, Transformer  # noqa: E402
from normlab.model.hf import from_hf, hf_config, to_hf  # noqa: E402

CASES = {  # family -> (placement, qk_norm, HF class)
    "llama": ("pre", "none", "LlamaForCausalLM"),
    "qwen3": ("pre", "head", "Qwen3ForCausalLM"),
    "olmo2": ("olmo2", "flat", "Olmo2ForCausalLM"),
}


def small(placement: str, qk_norm: str, tie: bool) -> ModelConfig:
    return ModelConfig(
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        vocab_size=128,
        max_seq_len=32,
        placement=placement,
        qk_norm=qk_norm,
        init_std=0.1,
        tie_embeddings=tie,
        rope_theta=5000.0,
    )


def randomise_gains(model: torch.nn.Module) -> None:
    for p in model.parameters():
        if p.dim() == 1:
            p.data.normal_(1.0, 0.2)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("family", sorted(CASES))
def test_normlab_to_hf(family, tie):
    placement, qk_norm, cls_name = CASES[family]
    torch.manual_seed(0)
    model = Transformer(small(placement, qk_norm, tie)).eval()
    randomise_gains(model)
    hf = to_hf(model)
    assert type(hf).__name__ == cls_name
    tokens = torch.randint(0, 128, (2, 20))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", sorted(CASES))
def test_hf_to_normlab(family):
    placement, qk_norm, cls_name = CASES[family]
    torch.manual_seed(1)
    hf = getattr(transformers, cls_name)(hf_config(small(placement, qk_norm, False))).eval()
    randomise_gains(hf)
    model = from_hf(hf)
    assert (model.config.placement, model.config.qk_norm) == (placement, qk_norm)
    tokens = torch.randint(0, 128, (2, 20))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() <= 1e-4


def test_unconvertible_architecture_is_named():
    with pytest.raises(ValueError, match="no HF transformers architecture for placement='peri'"):
        to_hf(Transformer(small("peri", "none", False)))
    with pytest.raises(ValueError, match="needs norm=rmsnorm"):
        to_hf(Transformer(ModelConfig(n_layers=1, norm="layernorm")))
