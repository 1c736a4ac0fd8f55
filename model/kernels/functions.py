"""Autograd functions over the Triton norm kernels (SCIENCE.md §10).

Public ops (`rms=True` selects RMSNorm, then `bias` must be None):
    norm(x, w, b, eps, rms)                 -> N(x)
    add_norm(x, f, w, b, eps, rms, alpha)   -> N(alpha * x + f)        grads: x <- alpha*dh, f <- dh
    add_then_norm(x, f, w, b, eps, rms)     -> (N(x + f), x + f)       dh gets the residual's grad
    norm_add(x, f, w, b, eps, rms)          -> x + N(f)                grads: x <- dy, f <- N'(f) dy
Inputs of any leading shape are flattened to rows of width N = w.numel(). x and f may differ in
dtype (e.g. an fp32 residual and a bf16 branch under autocast): h and y take the promoted dtype and
each gradient returns in its own input's dtype. g and b may be fp32 with bf16 inputs; statistics,
gradients of g and b and all arithmetic are fp32.
"""

from dataclasses import dataclass

import torch
import triton
from normlab.model.kernels import norm_kernels as nk

_sm_count: dict[int, int] = {}
# Overrides of the backward launch (None: the defaults below); benchmarks sweep them.
BWD_PROGRAMS_PER_SM: int | None = None
BWD_STAGES: int | None = None


@dataclass(frozen=True)
class _Launch:
    block_n: int
    fwd_warps: int
    bwd_warps: int
    bwd_stages: int  # rows of h and dy in flight in the backward loop (1: no prefetch)
    bwd_per_sm: int  # backward programs resident per SM


def _launch(n: int, dtype: torch.dtype, rms: bool) -> _Launch:
    """BLOCK_N = next_pow2(N), so a row lives in registers; warps grow with the width.

    Chosen from sm_90 resource usage (Triton 3.9; benchmarks/norm_kernel_resources.py): the
    forward holds ~3 row-sized values and runs spill-free at 16 elements per thread; the
    backward holds ~7 and needs 8 (N = 8192: 32 warps, <= 64 registers; 16 warps spill). Its
    loop prefetches the next rows (cp.async) except for LayerNorm at 8192, where that spills.
    With 8 warps RMSNorm's backward fits two programs per SM, LayerNorm's (<= 181 regs) one.
    """
    max_width = 65536 // dtype.itemsize
    if n > max_width:
        raise ValueError(
            f"Triton norm kernels hold a row in registers and support width <= {max_width} for "
            f"{dtype}; got {n}. Use norm_backend='torch' for this width."
        )
    block = triton.next_power_of_2(n)
    fwd = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    bwd = min(32, max(4, block // 256))
    stages = 3 if block <= 2048 else 1 if (block >= 8192 and not rms) else 2
    per_sm = max(1, (16 if rms else 8) // bwd)
    return _Launch(block, fwd, bwd, BWD_STAGES or stages, BWD_PROGRAMS_PER_SM or per_sm)


def _bwd_programs(rows: int, per_sm: int, device: torch.device) -> int:
    """Persistent backward grid: the programs that fit on the SMs at once, each walking a
    contiguous chunk of rows and keeping its dg/db partials in fp32 registers."""
    if device.type != "cuda":
        return max(1, min(rows, 4))  # interpreter: the count only changes the partial sums
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _sm_count:
        _sm_count[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return max(1, min(rows, _sm_count[idx] * per_sm))


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.shape[-1] != n:
        raise ValueError(f"norm input last dim {t.shape[-1]} != normalized width {n}")
    return t.reshape(-1, n).contiguous()


def _fwd(x, f, z, w, b, eps, alpha, rms, store_r, out_dtype):
    """Launch the forward kernel on (M, N) rows. Returns y, h (or None), mean, rstd."""
    m, n = x.shape
    cfg = _launch(n, x.dtype, rms)
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    r = torch.empty_like(y) if store_r else y
    mean = torch.empty(m if not rms else 0, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if m > 0:
        nk.norm_fwd_kernel[(m,)](
            x, x if f is None else f, x if z is None else z, y, r, w, w if b is None else b,
            rstd if rms else mean, rstd, n, eps, alpha,
            IS_RMS=rms, HAS_F=f is not None, HAS_Z=z is not None, STORE_R=store_r,
            HAS_BIAS=b is not None, BLOCK_N=cfg.block_n, num_warps=cfg.fwd_warps,
        )  # fmt: skip
    return y, (r if store_r else None), mean, rstd


def _bwd(x, f, h_dtype, dy, dres, w, b, mean, rstd, rms, alpha, dx_dtype, dx2_dtype, scale2):
    """Launch the backward kernel. Returns dh (dx_dtype), scale2*dh (dx2_dtype or None), dw, db."""
    m, n = x.shape
    cfg = _launch(n, x.dtype, rms)
    dx = torch.empty((m, n), dtype=dx_dtype, device=x.device)
    dx2 = None if dx2_dtype is None else torch.empty((m, n), dtype=dx2_dtype, device=x.device)
    grid = _bwd_programs(m, cfg.bwd_per_sm, x.device)
    # Every program writes its whole partial row (zeros if it gets no rows): no memset needed.
    dw = torch.empty((grid, n), dtype=torch.float32, device=x.device)
    db = torch.empty((grid, n), dtype=torch.float32, device=x.device) if b is not None else dw
    r = dx if dx_dtype == h_dtype else torch.empty(1, dtype=h_dtype, device=x.device)
    nk.norm_bwd_kernel[(grid,)](
        x, x if f is None else f, r, dy, dy if dres is None else dres, w,
        rstd if rms else mean, rstd, dx, dx if dx2 is None else dx2, dw, db,
        m, n, triton.cdiv(m, grid), alpha, scale2,
        IS_RMS=rms, HAS_F=f is not None, HAS_DRES=dres is not None,
        STORE_DX2=dx2 is not None, HAS_BIAS=b is not None, BLOCK_N=cfg.block_n,
        STAGES=cfg.bwd_stages, num_warps=cfg.bwd_warps,
    )  # fmt: skip
    dw_sum = dw.sum(0).to(w.dtype)
    db_sum = db.sum(0).to(b.dtype) if b is not None else None
    return dx, dx2, dw_sum, db_sum


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps: float, rms: bool):
        n = w.numel()
        x2 = _rows(x, n)
        y, _, mean, rstd = _fwd(x2, None, None, w, b, eps, 1.0, rms, False, x.dtype)
        ctx.save_for_backward(x2, w, b, mean, rstd)
        ctx.rms = rms
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, b, mean, rstd = ctx.saved_tensors
        dy2 = _rows(dy, w.numel())
        dx, _, dw, db = _bwd(
            x2, None, x2.dtype, dy2, None, w, b, mean, rstd, ctx.rms, 1.0, x2.dtype, None, 1.0
        )
        return dx.view(dy.shape), dw, db, None, None


class _AddNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f, w, b, eps: float, rms: bool, alpha: float):
        n = w.numel()
        x2, f2 = _rows(x, n), _rows(f, n)
        h_dtype = torch.promote_types(x.dtype, f.dtype)
        y, _, mean, rstd = _fwd(x2, f2, None, w, b, eps, alpha, rms, False, h_dtype)
        # h is recomputed from x and f in backward: no extra (M, N) tensor is stored.
        ctx.save_for_backward(x2, f2, w, b, mean, rstd)
        ctx.rms, ctx.alpha, ctx.shapes = rms, alpha, (x.shape, f.shape)
        return y.view(torch.broadcast_shapes(x.shape, f.shape))

    @staticmethod
    def backward(ctx, dy):
        x2, f2, w, b, mean, rstd = ctx.saved_tensors
        dy2 = _rows(dy, w.numel())
        shared = ctx.alpha == 1.0 and x2.dtype == f2.dtype
        h_dtype = torch.promote_types(x2.dtype, f2.dtype)
        df, dx, dw, db = _bwd(
            x2, f2, h_dtype, dy2, None, w, b, mean, rstd, ctx.rms, ctx.alpha,
            f2.dtype, None if shared else x2.dtype, ctx.alpha,
        )  # fmt: skip
        df = df.view(ctx.shapes[1])
        # Shared: one tensor object for both inputs (the engine then never accumulates into it
        # in place); two views of one storage would be stolen as two leaf grads and alias.
        dx = df if shared else dx.view(ctx.shapes[0])
        return dx, df, dw, db, None, None, None


class _AddThenNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f, w, b, eps: float, rms: bool):
        n = w.numel()
        x2, f2 = _rows(x, n), _rows(f, n)
        h_dtype = torch.promote_types(x.dtype, f.dtype)
        y, h, mean, rstd = _fwd(x2, f2, None, w, b, eps, 1.0, rms, True, h_dtype)
        ctx.save_for_backward(h, w, b, mean, rstd)
        ctx.rms, ctx.dtypes, ctx.shapes = rms, (x.dtype, f.dtype), (x.shape, f.shape)
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    def backward(ctx, dy, dres):
        h, w, b, mean, rstd = ctx.saved_tensors
        n = w.numel()
        dy2 = _rows(dy, n) if dy is not None else torch.zeros_like(h)
        dres2 = _rows(dres, n) if dres is not None else None
        x_dtype, f_dtype = ctx.dtypes
        shared = x_dtype == f_dtype
        df, dx, dw, db = _bwd(
            h, None, h.dtype, dy2, dres2, w, b, mean, rstd, ctx.rms, 1.0,
            f_dtype, None if shared else x_dtype, 1.0,
        )  # fmt: skip
        df = df.view(ctx.shapes[1])
        dx = df if shared else dx.view(ctx.shapes[0])  # one object when shared: see _AddNorm
        return dx, df, dw, db, None, None


class _NormAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f, w, b, eps: float, rms: bool):
        n = w.numel()
        x2, f2 = _rows(x, n), _rows(f, n)
        out_dtype = torch.promote_types(x.dtype, f.dtype)
        y, _, mean, rstd = _fwd(f2, None, x2, w, b, eps, 1.0, rms, False, out_dtype)
        ctx.save_for_backward(f2, w, b, mean, rstd)
        ctx.rms, ctx.x_meta = rms, (x.shape, x.dtype)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        f2, w, b, mean, rstd = ctx.saved_tensors
        dy2 = _rows(dy, w.numel())
        df, _, dw, db = _bwd(
            f2, None, f2.dtype, dy2, None, w, b, mean, rstd, ctx.rms, 1.0, f2.dtype, None, 1.0
        )
        x_shape, x_dtype = ctx.x_meta
        # dy itself (not a view of it) passes to x, as torch's own add backward does.
        return dy.to(x_dtype), df.view(x_shape), dw, db, None, None


def _check(x: torch.Tensor, f: torch.Tensor | None, b: torch.Tensor | None, rms: bool) -> None:
    if rms and b is not None:
        raise ValueError("RMSNorm has no bias; pass bias=None")
    if f is not None and f.shape != x.shape:
        raise ValueError(f"fused norm needs x and f of one shape; got {x.shape} and {f.shape}")


def norm(x, weight, bias=None, eps: float = 1e-5, rms: bool = False) -> torch.Tensor:
    """N(x): LayerNorm (rms=False) or RMSNorm (rms=True) over the last dim."""
    _check(x, None, bias, rms)
    return _Norm.apply(x, weight, bias, eps, rms)


def add_norm(x, f, weight, bias=None, eps: float = 1e-5, rms: bool = False, alpha: float = 1.0):
    """N(alpha * x + f): Post-LN (alpha = 1) and DeepNorm (Wang et al. 2022) in one pass."""
    _check(x, f, bias, rms)
    return _AddNorm.apply(x, f, weight, bias, eps, rms, float(alpha))


def add_then_norm(x, f, weight, bias=None, eps: float = 1e-5, rms: bool = False):
    """(N(x + f), x + f): Pre-LN's residual add fused with the next sub-layer's input norm."""
    _check(x, f, bias, rms)
    return _AddThenNorm.apply(x, f, weight, bias, eps, rms)


def norm_add(x, f, weight, bias=None, eps: float = 1e-5, rms: bool = False) -> torch.Tensor:
    """x + N(f): Peri-LN's output norm (Kim et al. 2025) fused with the residual add."""
    _check(x, f, bias, rms)
    return _NormAdd.apply(x, f, weight, bias, eps, rms)
