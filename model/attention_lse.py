"""Per-head maximum attention logit for QK-Clip (SCIENCE.md 7): the exact streamed maximum, and
causal attention that also returns the fused kernel's log-sum-exp bounds on it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend


@torch.no_grad()
def causal_max_logits(q: torch.Tensor, k: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Per-head max of q_i . k_j / sqrt(d) over batch and j <= i, streamed over query chunks.

    q: (B, H, T, D), k: (B, H_kv, T, D). Returns (H,) in fp32; no T x T matrix is kept whole.
    """
    B, H, T, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1).float()
    best = torch.full((H,), float("-inf"), device=q.device)
    for start in range(0, T, chunk):
        qc = q[:, :, start : start + chunk].float()
        s = qc @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, c, T)
        rows = torch.arange(start, start + qc.shape[2], device=q.device)[:, None]
        s = s.masked_fill(torch.arange(T, device=q.device)[None, :] > rows, float("-inf"))
        best = torch.maximum(best, s.amax(dim=(0, 2, 3)))
    return best


def attention_with_lse_bounds(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal attention that also yields per-head bounds on the max logit (SCIENCE.md 7), with
    the output bit-identical to `F.scaled_dot_product_attention`'s.

    The fused kernels keep each row's lse_i = log sum_j exp(s_ij); with n_i = i + 1 unmasked keys,
    lse_i - log(n_i) <= max_j s_ij <= lse_i. The kernel SDPA itself would choose is called with
    SDPA's arguments (ATen's op directly: the public call does not return its lse), so training is
    unchanged. Where SDPA would take a path that keeps no lse (its math path: dropout on the CPU,
    for one), SDPA runs as usual and both bounds are the exact streamed maximum. Returns the
    output (B, H, T, D) and the (lower, upper) bounds (H,) maximised over batch and rows.
    """
    gqa = k.shape[1] != q.shape[1]
    fused = _fused_attention_lse(q, k, v, dropout_p, gqa)
    if fused is None:
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa
        )
        exact = causal_max_logits(q, k)
        return y, (exact, exact)
    y, lse = fused  # lse (B, H, T) in fp32
    log_n = torch.arange(1, q.shape[2] + 1, device=q.device, dtype=torch.float32).log()
    lower = (lse.float() - log_n).amax(dim=(0, 2))
    return y, (lower.detach(), lse.float().amax(dim=(0, 2)).detach())


def _fused_attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, gqa: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output, lse) from the fused kernel SDPA picks for these inputs, called as SDPA calls it;
    None when SDPA would pick a kernel this does not mirror."""
    aten = torch.ops.aten
    choice = _sdp_choice(q, k, v, dropout_p, gqa)
    if choice == _FLASH and q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, True)[:2]
    if choice == _FLASH and q.shape[-1] % 8 == 0:  # SDPA pads other sizes
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True)[:2]
    if choice == _EFFICIENT and not gqa:
        return aten._scaled_dot_product_efficient_attention(q, k, v, None, True, dropout_p, True)[
            :2
        ]
    return None


_FLASH, _EFFICIENT = int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.EFFICIENT_ATTENTION)


def _sdp_choice(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, gqa: bool
) -> int:
    """The kernel SDPA would pick: fixed by shapes, dtypes and device, so torch.compile takes it
    as a constant instead of breaking the graph of a compiled block at this call."""
    return int(torch._fused_sdp_choice(q, k, v, None, dropout_p, True, enable_gqa=gqa))


# torch.compiler.assume_constant_result(_sdp_choice) without importing torch._dynamo at import
# time (seconds of CPU every command that loads the model code would pay): the decorator only sets
# this attribute, which dynamo reads when it traces; tests/launch/test_cli_startup.py holds the
# two equal.
DYNAMO_CONSTANT_MARK = "_dynamo_marked_constant"
setattr(_sdp_choice, DYNAMO_CONSTANT_MARK, True)
