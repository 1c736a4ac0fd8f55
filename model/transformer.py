"""The normlab decoder: embedding, L blocks whose norm placement is one config switch, head."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .attention import Attention
from .attention_cores import SoftCap
from .config import ModelConfig
from .init import init_weights
from .mlp import build_mlp
from .norms import POINTWISE, EmbedScale, build_norm, resolve_backend
from .parametrization import input_mult, output_mult, residual_mult
from .placements import const_scale, sublayer_kind, wrap_sublayer


class Block(nn.Module):
    """One decoder block: the attention sub-layer, then the MLP, each in its placement's wrapper."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        attn_norm, ffn_norm = (partial(build_norm, cfg, cfg.d_model, r) for r in ("attn", "ffn"))
        self.attn = wrap_sublayer(cfg, layer, "attn", Attention(cfg), attn_norm)
        self.mlp = wrap_sublayer(cfg, layer, "ffn", build_mlp(cfg), ffn_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class FusedPreBlock(Block):
    """Pre-LN block whose attention residual add is fused with the MLP's input norm (triton):
    (y, h) = N_mlp.add_then_norm(x, F_attn(N_attn(x))); x = h + F_mlp(y). Same math and modules as
    Block; hooks on the branches and the block fire as usual, those on the two wrappers do not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, h = self.mlp.norm_in.add_then_norm(x, self.attn.branch(self.attn.norm_in(x)))
        return h + self.mlp.branch(y)


def build_block(cfg: ModelConfig, layer: int) -> Block:
    """A plain Block, or the fused Pre-LN form when the block is Pre-LN on triton norms."""
    plain_pre = (
        sublayer_kind(cfg, layer) == "pre"
        and cfg.residual_scale == "none"
        and residual_mult(cfg) == 1.0
    )
    fused = resolve_backend(cfg.norm_backend) == "triton" and plain_pre
    return (FusedPreBlock if fused else Block)(cfg, layer)


class Transformer(nn.Module):
    """Decoder-only language model; `forward(tokens (B, T)) -> logits (B, T, V)`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_mult = const_scale(input_mult(cfg))  # µP α_in (SCIENCE.md 21)
        self.embed_norm = build_norm(cfg, cfg.d_model) if cfg.embed_norm else nn.Identity()
        # DyT/Derf: a learned scalar on the embedding, sqrt(d) at init (SCIENCE.md 16)
        self.embed_scale = EmbedScale(cfg.d_model) if cfg.norm in POINTWISE else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(build_block(cfg, layer) for layer in range(1, cfg.n_layers + 1))
        final = cfg.has_final_norm
        self.final_norm = build_norm(cfg, cfg.d_model, "final") if final else nn.Identity()
        self.head_mult = const_scale(output_mult(cfg))  # µP α_out / m_N on the head input
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cap = cfg.final_softcap  # Gemma 2: z' = c tanh(z / c); the loss (and z-loss) see z'
        self.final_cap = SoftCap(cap) if cap is not None else nn.Identity()
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self.init_weights()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed_mult(self.embed(tokens))
        x = self.drop(self.embed_norm(self.embed_scale(h)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.final_cap(self.head(self.head_mult(self.final_norm(x))))  # (B, T, V)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Apply the configured init scheme; also call after `to_empty()` from the meta device.

        Each parameter is drawn from generators keyed by `seed` and its name (model/init.py);
        seed None takes torch's current seed (`torch.manual_seed(s)` then build: seed s).
        """
        for module in self.modules():
            if isinstance(module, Attention):
                module.reset_rope()
        init_weights(self, self.config, torch.initial_seed() if seed is None else seed)

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if exclude_embedding else n
