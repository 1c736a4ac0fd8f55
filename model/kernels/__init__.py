"""Fused Triton norm kernels (SCIENCE.md §10): kernels, autograd functions and thin modules.

This package imports triton lazily: `triton_available` and `resolve_backend` work without it.
The kernels run on CUDA, or on CPU tensors through the Triton interpreter when TRITON_INTERPRET=1
is set before triton is first imported (slow: for tests only).
"""

import importlib.util
import os

import torch

BACKENDS = ("torch", "triton", "auto")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether the Triton kernels can run on `device` (default: CUDA if present), and why not."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'normlab[gpu]'; Linux only)"
    if _interpreting():
        return True, "TRITON_INTERPRET=1: kernels run through the Triton interpreter"
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        return False, (
            f"the Triton kernels need a CUDA device, got {dev.type!r} "
            "(TRITON_INTERPRET=1 runs them on CPU, slowly, for tests)"
        )
    if not torch.cuda.is_available():
        return False, (
            "no CUDA device is available (TRITON_INTERPRET=1 runs the kernels on CPU, slowly, "
            "for tests)"
        )
    return True, "CUDA"


def resolve_backend(name: str, device: torch.device | str | None = None) -> str:
    """Map a config's norm backend to 'torch' or 'triton'.

    'auto' picks triton on CUDA when triton is importable and torch elsewhere; 'triton' raises a
    ValueError saying why when the kernels cannot run on `device`.
    """
    if name not in BACKENDS:
        raise ValueError(f"norm_backend must be one of {BACKENDS}; got {name!r}")
    if name == "torch":
        return "torch"
    dev = torch.device(device) if device is not None else None
    if name == "auto":
        on_cuda = dev.type == "cuda" if dev is not None else torch.cuda.is_available()
        if not on_cuda:
            return "torch"
        return "triton" if importlib.util.find_spec("triton") is not None else "torch"
    ok, reason = triton_available(dev)
    if not ok:
        raise ValueError(f"norm_backend='triton' cannot run here: {reason}")
    return "triton"


__all__ = ["BACKENDS", "resolve_backend", "triton_available"]
