"""GPU-only checks of the Triton norm kernels: training-sized shapes, autocast and torch.compile.

tests/model/test_kernels.py covers every op on small shapes (on the GPU when there is one);
these add what only a GPU can show: widths up to 8192 with 16 warps, a persistent backward grid of
hundreds of programs, fp32 dg partials over many rows, and a model under bf16 autocast and
torch.compile with norm_backend='triton'.
"""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _ref(x, w, b, rms):
    """The norm in fp64: the yardstick both PyTorch and the kernels are measured against."""
    x, w = x.double(), w.double()
    if rms:
        return F.rms_norm(x, x.shape[-1:], w, 1e-6)
    return F.layer_norm(x, x.shape[-1:], w, b.double(), 1e-6)


def _err(a, ref):
    return (a.double() - ref).abs().max().item()


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("rows,n", [(8195, 2048), (4099, 5120), (16387, 8192)])
def test_large_norm_no_worse_than_torch(rows, n, rms):
    """bf16 output and gradients: error vs fp64 within 2x PyTorch's own bf16 error (+1 ulp)."""
    from normlab.model.kernels import functions as fn

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (3 * torch.randn(rows, n, device="cuda", generator=g) + 1).bfloat16().requires_grad_()
    w = (1 + 0.3 * torch.randn(n, device="cuda", generator=g)).bfloat16().requires_grad_()
    b = None if rms else (0.3 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    b = b.requires_grad_() if b is not None else None
    dy = torch.randn(rows, n, device="cuda", generator=g).bfloat16()
    params = [t for t in (x, w, b) if t is not None]
    y = fn.norm(x, w, b, 1e-6, rms)
    got = torch.autograd.grad(y, params, dy)
    y_t = F.rms_norm(x, (n,), w, 1e-6) if rms else F.layer_norm(x, (n,), w, b, 1e-6)
    torch_grads = torch.autograd.grad(y_t, params, dy)
    leaves = [t.detach().double().requires_grad_() for t in params]
    y64 = _ref(leaves[0], leaves[1], None if rms else leaves[2], rms)
    ref_grads = torch.autograd.grad(y64, leaves, dy.double())
    for a, t, r in zip((y, *got), (y_t, *torch_grads), (y64, *ref_grads), strict=True):
        ulp = r.abs().max().item() * 2**-8
        assert _err(a, r) <= 2 * _err(t, r) + ulp


@pytest.mark.parametrize("op", ["add_norm", "add_then_norm", "norm_add"])
def test_large_fused_match_unfused(op):
    from normlab.model.kernels import functions as fn

    rows, n = 8195, 4096
    g = torch.Generator(device="cuda").manual_seed(1)
    x, f = (torch.randn(rows, n, device="cuda", generator=g).bfloat16() for _ in range(2))
    x, f = x.requires_grad_(), f.requires_grad_()
    w = torch.ones(n, device="cuda", requires_grad=True)  # fp32 gain with bf16 activations
    dy = torch.randn(rows, n, device="cuda", generator=g).bfloat16()
    if op == "add_norm":
        outs, refs = (
            (fn.add_norm(x, f, w, None, 1e-6, True, 1.5),),
            (F.rms_norm(1.5 * x.float() + f.float(), (n,), w, 1e-6),),
        )
    elif op == "add_then_norm":
        y, h = fn.add_then_norm(x, f, w, None, 1e-6, True)
        h_ref = x + f
        outs, refs = (y, h), (F.rms_norm(h_ref.float(), (n,), w, 1e-6), h_ref)
    else:
        outs, refs = (
            (fn.norm_add(x, f, w, None, 1e-6, True),),
            (x.float() + F.rms_norm(f.float(), (n,), w, 1e-6),),
        )
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(o.float(), r.float(), atol=3e-2, rtol=2e-2)
    ups = [dy] * len(outs)
    got = torch.autograd.grad(outs, (x, f, w), ups)
    ref = torch.autograd.grad(
        refs, (x, f, w), [u.to(r.dtype) for u, r in zip(ups, refs, strict=True)]
    )
    for a, e in zip(got, ref, strict=True):
        scale = rows**0.5 if a.dim() == 1 else 1.0
        torch.testing.assert_close(a.float(), e.float(), atol=3e-2 * scale, rtol=2e-2)


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "deepnorm"])
def test_model_autocast_and_compile(placement):
    """bf16 autocast and torch.compile: triton and torch backends give the same loss and grads."""
    from normlab.model import ModelConfig, Transformer

    cfg = dict(n_layers=2, d_model=256, n_heads=4, d_ff=512, vocab_size=512, max_seq_len=128)
    tokens = torch.randint(0, 512, (4, 128), device="cuda")
    results = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**cfg, placement=placement, norm_backend=backend)).cuda()
        run = torch.compile(model)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(tokens).float().logsumexp(-1).mean()
        loss.backward()
        results[backend] = (loss.detach(), {k: p.grad for k, p in model.named_parameters()})
    torch.testing.assert_close(results["triton"][0], results["torch"][0], atol=2e-2, rtol=1e-2)
    for name, grad in results["torch"][1].items():
        got = results["triton"][1][name]
        rel = (got - grad).norm() / grad.norm().clamp_min(1e-12)
        assert rel < 5e-2, f"{name}: relative grad difference {rel:.3g}"
