"""Model FLOPs utilisation (SCIENCE.md section 20): FLOPs per token from the model config, the
peak of the device, and the per-log-step throughput row.

FLOPs per token = 6 N_mm + 12 L H d_h T (PaLM Appendix B; torchtitan, OLMo-core):
- N_mm: the matmul weights, i.e. every block's q, k, v, o projections (GQA: k and v are
  d x H_kv d_h), the attention gate's w_g (d x H headwise, d x d elementwise) and MLP matrices
  (SwiGLU three d x d_ff, GELU/ReLU two), plus the head (V x d).
  The input embedding is a lookup and is not counted; tied to the head, it is counted once, as
  the head's matmul. 1-D parameters (norm gains, biases, sink logits) are not counted, nor are
  the gate's sigmoid and soft-capping's tanh.
- 6 = 2 FLOPs per multiply-add x (1 forward + 2 backward matmuls).
- 12 L H d_h T: per layer, QK^T and PV for each query head (H, not H_kv) against T keys, x 3 for
  the backward; no halving for the causal mask (the convention of all three codebases).
- Activation recomputation is not counted (that would be HFU).

The peak is dense (no 2:4 sparsity) per GPU, keyed on `torch.cuda.get_device_name()`; a device
not in the table gets no MFU unless the recipe gives `logging.peak_tflops`: never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab.model.config import ModelConfig

# Dense TFLOP/s per GPU from NVIDIA's datasheets (tensor-core figures are the "with sparsity"
# numbers halved, as the datasheets' footnote says). fp32: plain FP32 (torch's default
# float32 matmul precision "highest"); tf32: fp32 matmuls on tensor cores ("high"/"medium").
# Checked in order: "H200" before "H20", "NVL"/"PCIe" before the SXM default.
PEAK_TFLOPS: list[tuple[tuple[str, ...], dict[str, float]]] = [
    (("A100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("H200", "NVL"), {}),  # H200 NVL: datasheet value not checked; no MFU (SCIENCE.md 20)
    (("H200",), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
    (("H100", "NVL"), {"bf16": 835.5, "fp16": 835.5}),
    (("H100", "PCIe"), {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0}),
    (("H100",), {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}),
]


def matmul_params(cfg: ModelConfig) -> int:
    """N_mm: the weights that enter a matmul once per token (see the module docstring)."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    mlp = (3 if cfg.mlp == "swiglu" else 2) * d * cfg.d_ff
    gate = {"none": 0, "headwise": d * cfg.n_heads, "elementwise": d * d}[cfg.attn_gate]
    block = 2 * d * d + 2 * d * kv + gate + mlp  # q, o: d x d; k, v: d x kv; w_g
    return cfg.n_layers * block + cfg.vocab_size * d  # + the head


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """12 L H d_h T: the score and value matmuls, forward and backward."""
    return 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs (forward + backward) per token at sequence length `seq_len`."""
    return 6 * matmul_params(cfg) + attention_flops_per_token(cfg, seq_len)


def compute_dtype(precision: str, float32_matmul: str = "highest") -> str:
    """The peak column a run computes in: bf16/fp16 autocast or parameters, else fp32/tf32."""
    if precision in ("bf16", "fp16"):
        return precision
    return "fp32" if float32_matmul == "highest" else "tf32"


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Dense peak of a known GPU for `dtype` (bf16, fp16, fp32, tf32); None if unknown."""
    for keys, peaks in PEAK_TFLOPS:
        if all(k in device_name for k in keys):
            return peaks.get(dtype)
    return None


@dataclass(frozen=True)
class Throughput:
    """Turns a step's tokens/s into tokens/s per GPU, TFLOP/s per GPU and MFU (a fraction)."""

    flops_per_token: int
    world: int
    peak_tflops: float | None  # per GPU; None: MFU is not reported

    def row(self, tokens_per_s: float) -> dict[str, float]:
        per_gpu = tokens_per_s / self.world
        tflops = per_gpu * self.flops_per_token / 1e12
        out = {"tokens_per_s_per_gpu": per_gpu, "tflops_per_gpu": tflops}
        if self.peak_tflops:
            out["mfu"] = tflops / self.peak_tflops
        return out

    def summary(self, tokens_per_s: float | None) -> dict[str, Any]:
        """What summary.json records: the count, the peak used and the run's mean MFU."""
        out: dict[str, Any] = {"flops_per_token": self.flops_per_token}
        out["peak_tflops"] = self.peak_tflops
        row = self.row(tokens_per_s) if tokens_per_s else {}
        out["tflops_per_gpu"] = row.get("tflops_per_gpu")
        out["mfu"] = row.get("mfu")
        return out


def run_throughput(
    cfg: ModelConfig, seq_len: int, world: int, device: Any, precision: str, given: float | None
) -> tuple[Throughput, str]:
    """The run's Throughput and a line saying where its peak comes from (or why there is none).

    `given` (logging.peak_tflops) wins; else a CUDA device is looked up in PEAK_TFLOPS; a CPU or
    an unknown GPU gets no MFU."""
    import torch

    fpt = flops_per_token(cfg, seq_len)
    if given is not None:
        return Throughput(fpt, world, given), f"MFU against logging.peak_tflops = {given:g}"
    if getattr(device, "type", str(device)) != "cuda":
        return Throughput(fpt, world, None), "MFU not reported on CPU (set logging.peak_tflops)"
    name = torch.cuda.get_device_name(device)
    dtype = compute_dtype(precision, torch.get_float32_matmul_precision())
    peak = peak_tflops(name, dtype)
    if peak is None:
        why = f"MFU not reported: no {dtype} peak known for {name!r} (set logging.peak_tflops)"
        return Throughput(fpt, world, None), why
    return Throughput(fpt, world, peak), f"MFU against {name} dense {dtype} peak {peak:g} TFLOP/s"
