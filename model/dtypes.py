"""The one precision rule the model's numerics share: compute in at least fp32 (bf16 and fp16 are
promoted, fp64 is kept, so reference tests in double precision stay in double precision)."""

from __future__ import annotations

import torch


def at_least_fp32_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(at_least_fp32_dtype(x.dtype))
