"""Triton norm kernels against PyTorch (SCIENCE.md §10): plain norms, every fused form, a model.

Without CUDA the kernels run on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1,
set here before triton decorates the kernels, and only while this module's tests run); with CUDA
the same tests run the compiled kernels on the GPU. Shapes stay small: the interpreter costs
milliseconds per row.
"""

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
_prev = os.environ.get("TRITON_INTERPRET")
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
from normlab.model.kernels import functions as fn  # noqa: E402
from normlab.model.kernels import norm_kernels as nk  # noqa: E402

from tests.conftest import REPO  # noqa: E402

if not HAS_CUDA and "Interpreted" not in type(nk.norm_fwd_kernel).__name__:
    importlib.reload(nk)  # decorated earlier without the interpreter: re-decorate under it
if _prev is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _prev

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (atol, rtol) vs PyTorch run in the same dtype: fp32 differs by summation order only; the half
# types by one rounding of the output / of each gradient element.
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 2e-2), torch.float16: (4e-3, 4e-3)}
SHAPES = [(5, 96), (37, 123), (123, 96), (5, 1000), (16, 1000), (123, 123)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _params(n, rms, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(n, generator=g)).to(DEVICE, dtype).requires_grad_()
    b = None if rms else (0.5 * torch.randn(n, generator=g)).to(DEVICE, dtype).requires_grad_()
    return w, b


def _rand(*shape, dtype, scale=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = scale * torch.randn(*shape, generator=g) + 0.3  # non-zero mean exercises LayerNorm's mu
    return t.to(DEVICE, dtype).requires_grad_()


def _ref_norm(x, w, b, eps, rms):
    if rms:
        return F.rms_norm(x, x.shape[-1:], w, eps)
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def _grads(out, upstream, tensors):
    """Gradients of sum(out_i * upstream_i) with respect to `tensors` (None entries skipped)."""
    tensors = [t for t in tensors if t is not None]
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * u.float()).sum() for o, u in zip(outs, upstream, strict=True))
    return torch.autograd.grad(loss, tensors)


def _close(actual, expected, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol * scale, rtol=rtol)


def _close_all(actual, expected, dtype, rows):
    for a, e in zip(actual, expected, strict=True):
        # dg and db sum `rows` terms: their rounding error grows like sqrt(rows) times an element's
        _close(a, e, dtype, scale=rows**0.5 if a.dim() == 1 else 1.0)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", SHAPES)
def test_norm_matches_torch(rows, n, dtype, rms):
    eps = 1e-5
    x = _rand(rows, n, dtype=dtype, scale=2.0)
    w, b = _params(n, rms, dtype)
    dy = _rand(rows, n, dtype=dtype, seed=2)
    y = fn.norm(x, w, b, eps, rms)
    y_ref = _ref_norm(x, w, b, eps, rms)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, y_ref, dtype)
    got = _grads(y, [dy], [x, w, b])
    ref = _grads(y_ref, [dy], [x, w, b])
    if dtype == torch.float32:
        _close_all(got, ref, dtype, rows)
        return
    # Low precision: torch's own bf16/fp16 weight-gradient sums depend on its thread count, so
    # measure both against fp64 and require the kernel to be no less accurate than torch.
    exact = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]
    ref64 = _grads(_ref_norm(*exact[:3], eps, rms), [dy.double()], exact)
    for g, r, e in zip(got, ref, ref64, strict=True):
        kernel_err = (g.double() - e).abs().max().item()
        torch_err = (r.double() - e).abs().max().item()
        assert kernel_err <= 2 * torch_err + TOL[dtype][0], (kernel_err, torch_err)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_leading_shape_noncontiguous_and_fp32_weight(rms):
    """(B, T, C) input, a transposed (non-contiguous) view, bf16 input with fp32 gain and bias."""
    x = _rand(7, 3, 96, dtype=torch.bfloat16).transpose(0, 1)  # (3, 7, 96), not contiguous
    w, b = _params(96, rms, torch.float32)
    dy = _rand(3, 7, 96, dtype=torch.bfloat16, seed=3)
    y = fn.norm(x, w, b, 1e-6, rms)
    # Reference: the same math in fp32, output rounded to the input dtype.
    y_ref = _ref_norm(x.float(), w, b, 1e-6, rms).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 7, 96)
    _close(y, y_ref, torch.bfloat16)
    got = _grads(y, [dy], [x, w, b])
    ref = _grads(_ref_norm(x.float(), w, b, 1e-6, rms), [dy], [x, w, b])
    assert got[1].dtype == torch.float32
    _close_all(got, ref, torch.bfloat16, rows=21)


def test_norm_empty_batch():
    x = torch.zeros(0, 3, 96, device=DEVICE, requires_grad=True)
    w, b = _params(96, rms=False)
    y = fn.norm(x, w, b)
    assert y.shape == (0, 3, 96)
    gx, gw, gb = torch.autograd.grad(y.sum(), [x, w, b])
    assert gx.shape == x.shape and not gw.any() and not gb.any()


FUSED_SHAPES = [(37, 123), (5, 1000)]


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", FUSED_SHAPES)
@pytest.mark.parametrize("alpha", [1.0, 2.38])
def test_add_norm_matches_unfused(rows, n, dtype, rms, alpha):
    """N(alpha * x + f): x gets alpha * dh, f gets dh."""
    x, f = _rand(rows, n, dtype=dtype, scale=2.0), _rand(rows, n, dtype=dtype, seed=4)
    w, b = _params(n, rms, dtype)
    dy = _rand(rows, n, dtype=dtype, seed=5)
    y = fn.add_norm(x, f, w, b, 1e-5, rms, alpha)
    y_ref = _ref_norm(x + f if alpha == 1.0 else alpha * x + f, w, b, 1e-5, rms)
    _close(y, y_ref, dtype)
    _close_all(_grads(y, [dy], [x, f, w, b]), _grads(y_ref, [dy], [x, f, w, b]), dtype, rows)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", FUSED_SHAPES)
def test_add_then_norm_matches_unfused(rows, n, dtype, rms):
    """(N(x + f), x + f): the residual's incoming gradient is added to dh."""
    x, f = _rand(rows, n, dtype=dtype, scale=2.0), _rand(rows, n, dtype=dtype, seed=4)
    w, b = _params(n, rms, dtype)
    dy, dres = _rand(rows, n, dtype=dtype, seed=5), _rand(rows, n, dtype=dtype, seed=6)
    y, h = fn.add_then_norm(x, f, w, b, 1e-5, rms)
    h_ref = x + f
    y_ref = _ref_norm(h_ref, w, b, 1e-5, rms)
    # x + f rounded once, as torch does; the interpreter truncates fp32 -> bf16 (the GPU rounds to
    # nearest even), so there it may differ by one bf16 ulp.
    ulp = 2**-7 if dtype == torch.bfloat16 and not HAS_CUDA else 0.0
    torch.testing.assert_close(h, h_ref, atol=0, rtol=ulp)
    _close(y, y_ref, dtype)
    got = _grads((y, h), [dy, dres], [x, f, w, b])
    ref = _grads((y_ref, h_ref), [dy, dres], [x, f, w, b])
    _close_all(got, ref, dtype, rows)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", FUSED_SHAPES)
def test_norm_add_matches_unfused(rows, n, dtype, rms):
    """x + N(f): x gets dy, f gets the norm's backward of dy."""
    x, f = _rand(rows, n, dtype=dtype, scale=2.0), _rand(rows, n, dtype=dtype, seed=4)
    w, b = _params(n, rms, dtype)
    dy = _rand(rows, n, dtype=dtype, seed=5)
    y = fn.norm_add(x, f, w, b, 1e-5, rms)
    y_ref = x + _ref_norm(f, w, b, 1e-5, rms)
    _close(y, y_ref, dtype, scale=2.0)  # values up to |x| + |N(f)|: one more rounding
    _close_all(_grads(y, [dy], [x, f, w, b]), _grads(y_ref, [dy], [x, f, w, b]), dtype, rows)


def _as_on_cuda(monkeypatch):
    """Make F.layer_norm / F.rms_norm refuse an input whose dtype is not its weight's, as eager
    CUDA does ("expected scalar type BFloat16 but found Float"; CPU's mixed-type path accepts
    it): a reference that would fail on a GPU then fails here too (the H200 run of 2026-12-04
    lost test_fused_mixed_dtypes[norm_add] to exactly that)."""
    for name in ("layer_norm", "rms_norm"):
        plain = getattr(F, name)

        def strict(x, shape, weight=None, *args, _plain=plain, _name=name, **kwargs):
            if weight is not None and weight.dtype != x.dtype:
                raise RuntimeError(f"{_name}: input {x.dtype}, weight {weight.dtype}")
            return _plain(x, shape, weight, *args, **kwargs)

        monkeypatch.setattr(F, name, strict)


@pytest.mark.parametrize("op", ["add_norm", "add_then_norm", "norm_add"])
def test_fused_mixed_dtypes(op, monkeypatch):
    """fp32 residual with a bf16 branch (autocast): promoted output, each grad in its own dtype.
    The references hold to eager CUDA's dtype rule on every device (`_as_on_cuda`)."""
    _as_on_cuda(monkeypatch)
    rows, n, alpha = 9, 96, 1.7
    x = _rand(rows, n, dtype=torch.float32, scale=2.0)
    f = _rand(rows, n, dtype=torch.bfloat16, seed=4)
    w, b = _params(n, rms=False)
    upstream = [_rand(rows, n, dtype=torch.float32, seed=s) for s in (5, 6)]
    if op == "add_norm":
        out, ref = (
            fn.add_norm(x, f, w, b, 1e-5, False, alpha),
            _ref_norm(alpha * x + f, w, b, 1e-5, False),
        )
    elif op == "add_then_norm":
        out, h = fn.add_then_norm(x, f, w, b, 1e-5, False)
        out, ref = (out, h), (_ref_norm(x + f, w, b, 1e-5, False), x + f)
    else:
        # N(f) in fp32, rounded to f's dtype as the kernel does. Not _ref_norm(f, ...): eager CUDA
        # layer_norm refuses a bf16 input with fp32 affine parameters ("expected scalar type
        # BFloat16 but found Float"; the H200 run of 2026-12-04), CPU's mixed-type path accepts it.
        out = fn.norm_add(x, f, w, b, 1e-5, False)
        ref = x + _ref_norm(f.float(), w, b, 1e-5, False).to(f.dtype)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs, strict=True):
        assert o.dtype == torch.float32
        _close(o, r, torch.bfloat16)
    got = _grads(out, upstream[: len(outs)], [x, f, w, b])
    expected = _grads(ref, upstream[: len(outs)], [x, f, w, b])
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.bfloat16
    _close_all(got, expected, torch.bfloat16, rows)


@pytest.mark.parametrize("op", ["add_norm", "add_then_norm", "norm_add"])
def test_shared_gradients_accumulate_on_leaves(op):
    """x and f may receive one gradient tensor; two backward passes must still sum correctly."""
    x, f = _rand(6, 96, dtype=torch.float32), _rand(6, 96, dtype=torch.float32, seed=4)
    w, _ = _params(96, rms=True)

    def loss(fused, a, c):
        if op == "add_norm":
            return (fused(a, c, w, None, 1e-6, True).square().sum() if fused else
                    F.rms_norm(a + c, (96,), w, 1e-6).square().sum())  # fmt: skip
        if op == "norm_add":
            y = fused(a, c, w, None, 1e-6, True) if fused else a + F.rms_norm(c, (96,), w, 1e-6)
            return y.sum()
        y, h = (
            fused(a, c, w, None, 1e-6, True)
            if fused
            else (F.rms_norm(a + c, (96,), w, 1e-6), a + c)
        )
        return y.sum() + (h * h).sum()

    for _ in range(2):
        loss(getattr(fn, op), x, f).backward()
    x_ref, f_ref = x.detach().clone().requires_grad_(), f.detach().clone().requires_grad_()
    loss(None, x_ref, f_ref).backward()
    torch.testing.assert_close(x.grad, 2 * x_ref.grad)
    torch.testing.assert_close(f.grad, 2 * f_ref.grad)


def test_modules_match_torch_norms():
    """Same state-dict keys and eps as model/norms.py, and the same outputs for every method."""
    from normlab.model.kernels.modules import TritonLayerNorm, TritonRMSNorm
    from normlab.model.norms import LayerNorm, RMSNorm

    for ref_cls, tri_cls in [(LayerNorm, TritonLayerNorm), (RMSNorm, TritonRMSNorm)]:
        ref, tri = ref_cls(64).to(DEVICE), tri_cls(64).to(DEVICE)
        assert ref.state_dict().keys() == tri.state_dict().keys() and ref.eps == tri.eps
        with torch.no_grad():
            ref.weight.normal_(1.0, 0.3)
        tri.load_state_dict(ref.state_dict())
        x, f = _rand(2, 5, 64, dtype=torch.float32), _rand(2, 5, 64, dtype=torch.float32, seed=7)
        torch.testing.assert_close(tri(x), ref(x))
        torch.testing.assert_close(tri.add_norm(x, f, 1.5), ref.add_norm(x, f, 1.5))
        torch.testing.assert_close(tri.norm_add(x, f), ref.norm_add(x, f))
        for a, e in zip(tri.add_then_norm(x, f), ref.add_then_norm(x, f), strict=True):
            torch.testing.assert_close(a, e)


def test_width_limit_is_a_clear_error():
    x = torch.zeros(2, 40000, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="width"):
        fn.norm(x, torch.ones(40000, device=DEVICE), None, 1e-6, True)
    with pytest.raises(ValueError, match="no bias"):
        fn.norm(x[:, :8], torch.ones(8), torch.zeros(8), 1e-6, True)


def test_resolve_backend(monkeypatch):
    from normlab.model import kernels

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernels.resolve_backend("torch", "cpu") == "torch"
    assert kernels.resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        kernels.resolve_backend("triton", "cpu")
    with pytest.raises(ValueError, match="norm_backend must be one of"):
        kernels.resolve_backend("cuda", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.resolve_backend("triton", "cpu") == "triton"
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: None)
    ok, reason = kernels.triton_available()
    assert not ok and "not installed" in reason


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("placement", ["pre", "post", "peri", "deepnorm", "olmo2", "mix"])
def test_model_triton_backend_matches_torch(placement, norm):
    """Whole model: logits and every parameter gradient agree between the two norm backends."""
    from normlab.model import ModelConfig, Transformer

    base = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=64, max_seq_len=16)
    base.update(placement=placement, norm=norm, embed_norm=placement == "peri", bias=True)
    models = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        models[backend] = Transformer(ModelConfig(**base, norm_backend=backend)).to(DEVICE)
    models["triton"].load_state_dict(models["torch"].state_dict())
    fused = {type(b).__name__ for b in models["triton"].blocks}
    assert ("FusedPreBlock" in fused) == (placement in ("pre", "mix"))  # Pre-LN add+norm fused
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    logits = {k: m(tokens) for k, m in models.items()}
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=2e-5, rtol=2e-5)
    for out in logits.values():
        out.float().square().mean().backward()
    grads = {k: dict(m.named_parameters()) for k, m in models.items()}
    for name, p in grads["torch"].items():
        torch.testing.assert_close(grads["triton"][name].grad, p.grad, atol=2e-5, rtol=2e-4)


def _bench():
    path = str(REPO / "benchmarks" / "bench_norm_kernels.py")
    spec = importlib.util.spec_from_file_location("bench_norm_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name", ["rmsnorm", "layernorm", "pre_rms", "post_rms", "deepnorm_rms", "peri_rms"]
)
def test_benchmark_ops_compare_like_for_like(name):
    """The benchmark's triton and eager callables compute the same op (forward and grads)."""
    bench = _bench()
    op = bench.OPS[name]
    x, f = _rand(6, 64, dtype=torch.float32), _rand(6, 64, dtype=torch.float32, seed=4)
    w, b = _params(64, op.rms)
    outs = {k: make(op, w, b)(x, f) for k, make in (("t", bench.triton_fn), ("e", bench.eager_fn))}
    ups = [_rand(6, 64, dtype=torch.float32, seed=s) for s in (5, 6)][: len(outs["e"])]
    assert len(outs["t"]) == len(outs["e"]) == op.fwd_io[1]
    for a, e in zip(outs["t"], outs["e"], strict=True):
        _close(a, e, torch.float32)
    wrt = [x, None if op.pattern == "norm" else f, w, b]
    _close_all(_grads(outs["t"], ups, wrt), _grads(outs["e"], ups, wrt), torch.float32, rows=6)


def test_benchmark_summary_ratios_and_targets():
    bench = _bench()
    base = dict(op="rmsnorm", tokens=16384, hidden=2048, copy_gbs=4000.0)
    rows = [
        dict(base, impl="triton", fwd_ms=1.0, bwd_ms=2.0, fwd_pct=90.0, bwd_pct=75.0),
        dict(base, impl="compile", fwd_ms=1.1, bwd_ms=3.0, fwd_pct=80.0, bwd_pct=50.0),
        dict(base, impl="eager", fwd_ms=2.0, bwd_ms=5.0, fwd_pct=45.0, bwd_pct=30.0),
    ]
    (line,) = bench.summarize(rows)
    assert line["bwd_vs_compile"] == 1.5 and line["fwd_vs_eager"] == 2.0 and line["meets"]
    rows[1]["bwd_ms"] = 2.2  # only 1.1x torch.compile: misses the 1.2x target
    assert not bench.summarize(rows)[0]["meets"]
    if not HAS_CUDA:
        assert bench.main([]) == 0  # no CUDA: a message and a clean exit


def test_kernels_compile_for_h100_without_spills():
    """The interpreter skips Triton's compiler: compile every launched variant for sm_90 in a
    fresh process (bf16, the launch's warps) and check that none spills registers."""
    root = str(REPO)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("triton's bundled CUDA tools (ptxas, cuobjdump) are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    script = os.path.join(root, "benchmarks", "norm_kernel_resources.py")
    cmd = [sys.executable, script, "--widths", "123", "2048", "8192", "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert len(rows) == 3 * 2 * 8  # widths x norms x (4 forward + 4 backward variants)
    spilling = [r for r in rows if r["spill_bytes"] > 0]
    assert not spilling, spilling
