"""Language-model loss: cross-entropy plus the optional z-loss (SCIENCE.md section 5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LMLoss:
    """The training objective as a component: cross-entropy plus z_loss * log(Z)^2 (PaLM;
    SCIENCE.md 5). Called with (logits, targets), it returns (loss, {"ce", "z"}) in fp32."""

    z_loss: float = 0.0

    def __call__(
        self, logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return lm_loss(logits, targets, z_loss_coef=self.z_loss)


def lm_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    z_loss_coef: float = 0.0,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CE + coef * mean(logsumexp(logits)^2) over non-ignored tokens; returns (loss, parts).

    logits (B, T, V) in any dtype are upcast to fp32; targets (B, T).
    """
    flat = logits.float().reshape(-1, logits.shape[-1])
    flat_targets = targets.reshape(-1)
    ce = F.cross_entropy(flat, flat_targets, ignore_index=ignore_index)
    if z_loss_coef == 0.0:
        return ce, {"ce": ce.detach()}
    keep = flat_targets != ignore_index
    z = z_loss_coef * torch.logsumexp(flat[keep], dim=-1).pow(2).mean()
    return ce + z, {"ce": ce.detach(), "z": z.detach()}
