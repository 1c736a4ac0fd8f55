"""Outlier kurtosis (docs/SCIENCE.md 24, normlab's section): He et al.'s neuron-norm kurtosis and
the element kurtosis, normlab's only two kurtosis estimators (instruments.kurtosis and
instruments.fp8 use them).

For the activations X of one site (n tokens by d neurons: every token a log step's training
forwards saw there, all micro-batches and all ranks):

- **neuron-norm kurtosis** (He, Noci, Paliotta, Schlag, Hofmann 2024, arXiv 2405.19279: "the
  kurtosis over neuron activation norms"): the RMS of each neuron over the tokens,
  `s_j = sqrt(mean_a X_aj^2)`, and the raw moment ratio of those d numbers,
  `mean_j s_j^4 / (mean_j s_j^2)^2`. It lies in [1, d]: 1 when every neuron has the same RMS, d
  when one neuron carries all of it. It sees outlier *features* (channels), not outlier
  *tokens*: a massive token that is large in every neuron raises every RMS alike and leaves it 1.
- **element kurtosis**: `mean x^4 / (mean x^2)^2` over all n d entries, the raw fourth moment
  about zero, not centred on the mean. normlab's [choice]: an e4m3 cast is scaled about zero, so
  the tail that matters is the tail of |x|; it is the same raw moment ratio as He et al.'s, over
  entries; it is defined for a constant tensor (1) where the centred one is 0/0. 3 for a
  zero-mean Gaussian, 1 for +-c, large for a massive token and for an outlier channel alike.

Both come from one row of float64 sums per site, `(sum_a X_a1^2, ..., sum_a X_ad^2, sum X^4, n)`,
which adds across micro-batches and ranks (one all-reduce), so the instruments keep d + 2 numbers
per site on the device and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from normlab.launch.engines.recompute import recomputing
from normlab.launch.metric_keys import block_key

FOURTH, TOKENS = -2, -1  # row[:-2]: per-neuron sums of squares; row[-2]: sum x^4; row[-1]: n


def moment_row(width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """An empty row of sums for activations of `width` neurons."""
    return torch.zeros(width + 2, dtype=torch.float64, device=device)


def moment_sums(x: torch.Tensor) -> torch.Tensor:
    """The row of sums of activations x (..., d): every leading index is a token."""
    x2 = x.detach().double().reshape(-1, x.shape[-1]).square()
    n = torch.full((1,), x2.shape[0], dtype=x2.dtype, device=x2.device)
    return torch.cat([x2.sum(0), x2.square().sum().reshape(1), n])


def add_moments(row: torch.Tensor, x: torch.Tensor) -> None:
    """Add x's sums into `row` in place (a forward hook's whole work)."""
    row.add_(moment_sums(x))


def neuron_norm_kurtosis_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """He et al.'s `mean_j s_j^4 / (mean_j s_j^2)^2` from rows (..., d + 2) of sums."""
    s2 = sums[..., :FOURTH] / sums[..., TOKENS, None].clamp_min(1)  # s_j^2
    return s2.square().mean(-1) / s2.mean(-1).square().clamp_min(1e-300)


def element_kurtosis_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """`mean x^4 / (mean x^2)^2` over all entries from rows (..., d + 2) of sums (raw: about 0)."""
    entries = (sums[..., TOKENS] * (sums.shape[-1] - 2)).clamp_min(1)
    e2 = sums[..., :FOURTH].sum(-1) / entries
    return (sums[..., FOURTH] / entries) / e2.square().clamp_min(1e-300)


def neuron_norm_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """He et al.'s neuron-norm kurtosis of activations x (..., d), in float64."""
    return neuron_norm_kurtosis_from_sums(moment_sums(x))


def element_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """The raw element kurtosis of activations x (..., d), in float64."""
    return element_kurtosis_from_sums(moment_sums(x))


def outlier_hook(row: torch.Tensor, pre: bool = False) -> Callable[..., None]:
    """A forward hook (or, with `pre`, a forward pre-hook: the module's input) that adds the
    observed activations' sums into `row` on training forwards, once per forward (not again
    when activation checkpointing recomputes it). It holds the row itself, not a block index, so
    per-block compiled blocks share one graph."""

    def add(module: torch.nn.Module, x: torch.Tensor) -> None:
        if module.training and not recomputing():
            add_moments(row, x)

    if pre:
        return lambda module, args: add(module, args[0])
    return lambda module, args, out: add(module, out)


def report_outlier_kurtosis(
    metrics: dict[str, Any],
    sums: torch.Tensor,
    element: str,
    neuron: str,
    hooked: Iterable[int] | None = None,
) -> None:
    """Write both estimators of each hooked block's reduced row of sums (blocks, d + 2) into
    metrics as device tensors (every block when `hooked` is None): no host sync here, the trainer
    copies a log step's metrics once."""
    kurt = torch.stack([element_kurtosis_from_sums(sums), neuron_norm_kurtosis_from_sums(sums)])
    for i in range(sums.shape[0]) if hooked is None else hooked:
        metrics[block_key(element, i)] = kurt[0, i].float()
        metrics[block_key(neuron, i)] = kurt[1, i].float()
