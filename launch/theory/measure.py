"""Xiong et al. (2020) at initialisation, measured on normlab's decoder (SCIENCE.md section 3).

The analysis setting of SCIENCE.md section 2: Xavier-normal weights, W_Q = W_K = 0 (uniform causal
attention), LayerNorm with gain 1 and no bias, a ReLU MLP, N(0, 1) embeddings (E||x_0||^2 = d).
Three measurements, each averaged over seeds:

- Lemma 2: E||x_l||^2 / d after each block's second residual add (before Post-LN's closing norm).
- Theorem 1: ||dL/dW2|| of the last block's MLP output weight against depth L.
- Figure 3: ||dL/dW2|| of every block's MLP output weight in one model (the per-layer profile).

The loss is next-token cross-entropy on uniformly random tokens: at initialisation the model has
learnt nothing, so the data's content does not matter, only its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from normlab.model import ModelConfig, Transformer

PLACEMENTS = ("post", "pre")


@dataclass(frozen=True)
class TheorySetup:
    """Shapes of the analysis models and of the random batch (defaults run in seconds on a CPU)."""

    d_model: int = 128
    d_ff_mult: int = 1  # Lemma 2's 3/2 d assumes d_ff = d; 4 gives the usual MLP (about 1.32 d)
    n_heads: int = 4
    vocab_size: int = 512
    seq_len: int = 64
    batch_size: int = 8
    seeds: int = 24  # 6 leave Figure 3's Post-LN ratio undecided (its interval spans 1.2)
    depths: tuple[int, ...] = (2, 4, 8, 16)
    profile_depth: int = 8  # blocks of the model whose per-layer gradients Figure 3 shows
    lemma_depth: int = 8  # blocks of the model whose stream norms Lemma 2 shows

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff_mult", "n_heads", "vocab_size", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        if len(self.depths) < 2 or min(self.depths) < 1 or len(set(self.depths)) < len(self.depths):
            raise ValueError(f"depths must be >= 2 distinct values >= 1, got {list(self.depths)}")
        for name in ("profile_depth", "lemma_depth"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads of even "
                "size (RoPE)"
            )

    @property
    def d_ff(self) -> int:
        return self.d_ff_mult * self.d_model

    def model_config(self, placement: str, n_layers: int) -> ModelConfig:
        return ModelConfig(
            n_layers=n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            vocab_size=self.vocab_size,
            max_seq_len=self.seq_len,
            mlp="relu",
            norm="layernorm",
            norm_eps=1e-5,
            placement=placement,
            init="xavier",
        )


def ffn_gain(d_ff_mult: int) -> float:
    """E||ReLU(x W1) W2||^2 / ||x||^2 under Xavier-normal W1 (d x r d) and W2 (r d x d).

    Each output of x W1 has variance ||x||^2 * 2 / (d + r d); ReLU keeps half of the energy of
    the r d outputs; W2 multiplies the energy by d * 2 / (d + r d). Total 2 r / (1 + r)^2:
    1/2 for r = 1 (Xiong et al.'s setting), 0.32 for r = 4."""
    r = float(d_ff_mult)
    return 2.0 * r / (1.0 + r) ** 2


def lemma2_prediction(placement: str, layer: int, d_ff_mult: int) -> tuple[float, float]:
    """(lower, upper) of E||x_l||^2 / d by Lemma 2 (equal for Post-LN).

    Post-LN: the stream enters the MLP normalised (||.||^2 = d) and the MLP adds ffn_gain * d.
    Pre-LN: each block adds the MLP's ffn_gain * d and an attention term between 0 and d (a
    uniform average of normalised, norm-preserving value vectors), starting from E||x_0||^2 = d."""
    c = ffn_gain(d_ff_mult)
    if placement == "post":
        return 1.0 + c, 1.0 + c
    return 1.0 + layer * c, 1.0 + layer * (1.0 + c)


def _batch(setup: TheorySetup, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(0, setup.vocab_size, (setup.batch_size, setup.seq_len + 1), generator=gen)


def _model(setup: TheorySetup, placement: str, n_layers: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(setup.model_config(placement, n_layers))


@torch.no_grad()
def stream_energy(model: Transformer, tokens: torch.Tensor) -> list[float]:
    """E||x_l||^2 / d for each block l: after the MLP's residual add, before any closing norm.

    Walks the blocks by their equations (Post-LN: x = N(h + F(h)); Pre-LN: x = h + F(N(h)))
    to read the sum that Post-LN's norm hides."""
    d = model.config.d_model
    x = model.embed(tokens[:, :-1])
    out = []
    for block in model.blocks:
        h = block.attn(x)
        mlp = block.mlp
        if model.config.placement == "post":
            s = h + mlp.branch(h)
            x = mlp.norm(s)
        else:
            s = h + mlp.branch(mlp.norm_in(h))
            x = s
        out.append(float(s.pow(2).sum(-1).mean()) / d)
    return out


def down_proj_grads(model: Transformer, tokens: torch.Tensor) -> list[float]:
    """Frobenius norm of dL/dW2 (the MLP output weight) of every block, input to output."""
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return [float(b.mlp.branch.down_proj.weight.grad.norm()) for b in model.blocks]


@dataclass
class TheoryResult:
    """Arrays of the measurements (result_from_json reads them back from theory.json)."""

    setup: TheorySetup
    lemma2: dict[str, np.ndarray] = field(default_factory=dict)  # placement -> (seeds, layers)
    theorem1: dict[str, np.ndarray] = field(default_factory=dict)  # placement -> (seeds, depths)
    profile: dict[str, np.ndarray] = field(default_factory=dict)  # placement -> (seeds, layers)


def result_from_json(data: dict) -> TheoryResult:
    """The TheoryResult stored in a theory.json (what `normlab theory` wrote)."""
    setup = dict(data["setup"])
    setup["depths"] = tuple(setup["depths"])
    res = TheoryResult(TheorySetup(**setup))
    for name in ("lemma2", "theorem1", "profile"):
        getattr(res, name).update({p: np.asarray(v) for p, v in data[name].items()})
    return res


def measure(setup: TheorySetup, only: list[int] | None = None) -> TheoryResult:
    """Every measurement over every seed (one fresh model and batch per seed and shape);
    `only`: just these seeds (a cheap re-measurement of a few rows of a stored result)."""
    res = TheoryResult(setup)
    seeds = range(setup.seeds) if only is None else only
    for p in PLACEMENTS:
        res.lemma2[p] = np.array(
            [stream_energy(_model(setup, p, setup.lemma_depth, s), _batch(setup, s)) for s in seeds]
        )
        res.theorem1[p] = np.array(
            [
                [
                    down_proj_grads(_model(setup, p, n, s), _batch(setup, s))[-1]
                    for n in setup.depths
                ]
                for s in seeds
            ]
        )
        res.profile[p] = np.array(
            [
                down_proj_grads(_model(setup, p, setup.profile_depth, s), _batch(setup, s))
                for s in seeds
            ]
        )
    return res


def loglog_slope(xs: list[int] | tuple[int, ...], ys: np.ndarray) -> float:
    """Least-squares slope of log y against log x (-0.5 for y proportional to 1/sqrt(x))."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(ys), 1)[0])
