"""Triton kernels for LayerNorm and RMSNorm, plain and fused with residual adds (SCIENCE.md §10).

Two kernels cover every op; `constexpr` flags select the pattern at compile time:

    plain          y = N(x)
    add_norm       y = N(h), h = alpha * x + f              (post: alpha = 1; DeepNet's DeepNorm)
    add_then_norm  y = N(h), h = x + f, and h is written    (pre: residual add + next norm)
    norm_add       y = x + N(f)                             (Peri-LN output norm + residual add)

Math, with row statistics in fp32 whatever the storage dtype (eps inside the root):
    LayerNorm  mu = mean(h), r = 1 / sqrt(mean((h - mu)^2) + eps), xh = (h - mu) * r, y = g*xh + b
    RMSNorm    r = 1 / sqrt(mean(h^2) + eps),                      xh = h * r,        y = g*xh
    backward, m = g * dy:
    LayerNorm  dh = r * (m - mean(m) - xh * mean(m * xh))
    RMSNorm    dh = r * (m - xh * mean(m * xh))
    dg = sum_rows(dy * xh), db = sum_rows(dy)

Forward: one program per row, BLOCK_N = next_pow2(N) so a row lives in registers (Triton tutorial
05-layer-norm). Backward: a persistent grid of a few programs per SM; each walks a contiguous chunk
of rows and keeps its dg/db partials in fp32 registers, written once at the end and summed by the
caller (the Liger-Kernel scheme; the tutorial's partials are in the input dtype and use locks).
The row loop is software-pipelined (the next rows' loads are issued while one is reduced) and
re-reads g each row from L1 instead of holding it: registers, not bandwidth, limit wide rows.
Bytes per element in bf16 (SCIENCE.md §10): forward 4 (add_then_norm 8, add_norm and norm_add
6); backward 6 (add_then_norm and add_norm 8, DeepNorm 10, norm_add 6; dx = dy is free).
"""

import triton
import triton.language as tl


@triton.jit
def norm_fwd_kernel(
    X,  # (M, N) norm input, or the residual x for add_norm / add_then_norm
    F,  # (M, N) branch output f (HAS_F) -- or unused
    Z,  # (M, N) residual added after the norm (HAS_Z, norm_add) -- or unused
    Y,  # (M, N) output
    R,  # (M, N) h = alpha*x + f in its storage dtype: written if STORE_R, else only its dtype used
    W,  # (N,) gain g
    B,  # (N,) bias b (HAS_BIAS)
    Mean,  # (M,) fp32, LayerNorm only
    Rstd,  # (M,) fp32
    N,
    eps,
    alpha,
    IS_RMS: tl.constexpr,
    HAS_F: tl.constexpr,
    HAS_Z: tl.constexpr,
    STORE_R: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One row: h = alpha*x + f (or x), y = N(h) (+ z). Saves mean and rstd of the row in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offs = row * N + cols
    h = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_F:
        f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
        # Round h to its storage dtype, as the unfused `alpha * x + f` would, so that forward,
        # the stored residual and the backward's recomputation all see the same numbers.
        h = (alpha * h + f).to(R.dtype.element_ty).to(tl.float32)
        if STORE_R:
            tl.store(R + offs, h.to(R.dtype.element_ty), mask=mask)
    if IS_RMS:
        xh_num = h
    else:
        mean = tl.sum(h, axis=0) / N
        xh_num = tl.where(mask, h - mean, 0.0)
        tl.store(Mean + row, mean)
    var = tl.sum(xh_num * xh_num, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = xh_num * rstd * w
    if HAS_BIAS:
        y += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z:
        # N(f) is rounded to f's dtype before the add, as in the unfused `x + N(f)`.
        y = y.to(X.dtype.element_ty).to(tl.float32)
        y += tl.load(Z + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def norm_bwd_kernel(
    X,  # (M, N) norm input h, or the residual x when HAS_F (h is recomputed as alpha*x + f)
    F,  # (M, N) branch output f (HAS_F)
    R,  # (M, N) any tensor in h's storage dtype (rounding of the recomputed h)
    DY,  # (M, N) gradient of the norm output
    DRES,  # (M, N) gradient of the residual output h (HAS_DRES, add_then_norm)
    W,  # (N,)
    Mean,  # (M,) fp32, LayerNorm only
    Rstd,  # (M,) fp32
    DX,  # (M, N) dL/dh (+ dres): the gradient for f, and for x when alpha = 1
    DX2,  # (M, N) scale2 * DX in x's dtype (STORE_DX2)
    DW,  # (G, N) fp32 partials of dg, one row per program
    DB,  # (G, N) fp32 partials of db (HAS_BIAS)
    M,
    N,
    rows_per_program,
    alpha,
    scale2,
    IS_RMS: tl.constexpr,
    HAS_F: tl.constexpr,
    HAS_DRES: tl.constexpr,
    STORE_DX2: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Rows [pid*rows_per_program, ...): dh = r*(m - [mean(m)] - xh*mean(m*xh)); dg, db partials."""
    pid = tl.program_id(0).to(tl.int64)  # int64 offsets: M * N may pass 2^31
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    # Software-pipelined: the next rows' h and dy stream into shared memory (cp.async) while
    # this row is reduced, keeping enough bytes in flight with one or two programs per SM.
    for row in tl.range(row_start, row_end, num_stages=STAGES):
        offs = row * N + cols
        h = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_F:
            f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
            h = (alpha * h + f).to(R.dtype.element_ty).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        if IS_RMS:
            xh = h * rstd
        else:
            xh = tl.where(mask, (h - tl.load(Mean + row)) * rstd, 0.0)
        # g is re-read each row (an L1 hit) rather than held: registers are the limit here.
        m = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) * dy
        c = tl.sum(m * xh, axis=0) / N
        if IS_RMS:
            dh = (m - xh * c) * rstd
        else:
            dh = (m - tl.sum(m, axis=0) / N - xh * c) * rstd
        if HAS_DRES:
            dh += tl.load(DRES + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, dh.to(DX.dtype.element_ty), mask=mask)
        if STORE_DX2:
            tl.store(DX2 + offs, (scale2 * dh).to(DX2.dtype.element_ty), mask=mask)
        dw += dy * xh
        if HAS_BIAS:
            db += dy
    tl.store(DW + pid * N + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(DB + pid * N + cols, db, mask=mask)
