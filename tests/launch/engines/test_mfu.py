"""MFU accounting (SCIENCE.md section 20): the FLOPs count against a hand formula, the published
Llama-3.1-8B test vector, torch's FlopCounterMode, and the peak table's lookups."""

from __future__ import annotations

import pytest
import torch
from normlab.launch.training.mfu import (
    Throughput,
    compute_dtype,
    flops_per_token,
    matmul_params,
    peak_tflops,
    run_throughput,
)
from normlab.model import ModelConfig, Transformer
from normlab.model.presets import PRESETS, count_params
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_match_the_hand_formula(preset: str) -> None:
    """MHA presets, SwiGLU, untied: 6 (L (4 d^2 + 3 d d_ff) + V d) + 12 L d T."""
    p = PRESETS[preset]
    cfg = ModelConfig(**p)
    L, d, f, V, T = p["n_layers"], p["d_model"], p["d_ff"], p["vocab_size"], p["max_seq_len"]
    assert flops_per_token(cfg, T) == 6 * (L * (4 * d * d + 3 * d * f) + V * d) + 12 * L * d * T
    # torchtitan's 6 (params - embedding) + 12 L H d_h T differs only by the norm gains
    titan = 6 * (count_params(cfg) - V * d) + 12 * L * d * T
    norm_gains = L * 2 * d + d
    assert titan - flops_per_token(cfg, T) == 6 * norm_gains


def test_llama31_8b_test_vector() -> None:
    """SCIENCE.md 20: N_mm 7,504,658,432 and 57,912,852,480 FLOPs per token at T 8192; at the
    torchtitan benchmark's 5,762 tokens/s/GPU on an H100 (989.5 TFLOP/s) that is 33.7 % MFU."""
    cfg = ModelConfig(
        n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
        vocab_size=128256, max_seq_len=8192,
    )  # fmt: skip
    assert matmul_params(cfg) == 7_504_658_432
    assert flops_per_token(cfg, 8192) == 57_912_852_480
    mfu = Throughput(flops_per_token(cfg, 8192), 8, 989.5).row(8 * 5762)["mfu"]
    assert mfu == pytest.approx(0.337, abs=5e-4)


def _linear_weights(model: Transformer) -> int:
    """Every Linear weight the model multiplies with (the head once, tied or not)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


SMALL = [
    dict(n_kv_heads=2),
    dict(mlp="gelu", tie_embeddings=True),
    dict(mlp="relu", placement="post"),
    dict(placement="mix", qk_norm="flat", bias=True),
    dict(placement="peri", embed_norm=True, qk_norm="head", n_kv_heads=1),
    dict(attn_gate="headwise", attn_sinks=True),
    dict(attn_gate="elementwise", attn_softcap=50.0, n_kv_heads=2),
]


@pytest.mark.parametrize("extra", SMALL, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_flop_counter_agrees(extra: dict) -> None:
    """A forward and backward under FlopCounterMode (SDPA's math path, whose matmuls the counter
    sees) matches flops_per_token x tokens within 2 % (it agrees exactly: norms, biases and
    softmax are not matmuls), and N_mm equals the built model's Linear weights."""
    cfg = ModelConfig(
        n_layers=2, d_model=64, n_heads=4, d_ff=96, vocab_size=200, max_seq_len=48, **extra
    )
    torch.manual_seed(0)
    model = Transformer(cfg)
    assert _linear_weights(model) == matmul_params(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (3, 40))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens).float().logsumexp(-1).mean().backward()
    expected = flops_per_token(cfg, 40) * tokens.numel()
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
        ("NVIDIA H100 PCIe", "fp16", 756.5),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H200", "fp32", 67.0),
        ("NVIDIA H200 NVL", "bf16", None),  # not checked: no MFU rather than a guess
        ("NVIDIA H20", "bf16", None),  # not an H200
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_peak_table(name: str, dtype: str, peak: float | None) -> None:
    assert peak_tflops(name, dtype) == peak


def test_compute_dtype_follows_autocast_and_matmul_precision() -> None:
    assert compute_dtype("bf16") == "bf16" and compute_dtype("fp16", "high") == "fp16"
    assert compute_dtype("fp32", "highest") == "fp32"
    assert compute_dtype("fp32", "high") == "tf32"


def test_cpu_reports_mfu_only_against_a_given_peak() -> None:
    cfg = ModelConfig(**PRESETS["tiny"])
    none, why = run_throughput(cfg, 256, 1, torch.device("cpu"), "fp32", None)
    assert none.peak_tflops is None and "mfu" not in none.row(1000.0) and "CPU" in why
    given, _ = run_throughput(cfg, 256, 2, torch.device("cpu"), "fp32", 0.5)
    row = given.row(2000.0)  # two ranks: 1000 tokens/s each
    assert row["tokens_per_s_per_gpu"] == 1000.0
    assert row["tflops_per_gpu"] == pytest.approx(1000.0 * flops_per_token(cfg, 256) / 1e12)
    assert row["mfu"] == pytest.approx(row["tflops_per_gpu"] / 0.5)


def test_trainer_logs_mfu_against_the_given_peak(tiny_data, tmp_path, capsys) -> None:
    """Every log row carries tokens/s per GPU, TFLOP/s per GPU and MFU against
    logging.peak_tflops, consistent with flops_per_token; summary.json, `status` and `compare`
    report it; without a peak on the CPU there is no MFU anywhere."""
    import json

    from normlab.launch.cli import main
    from normlab.launch.config import load_config
    from normlab.launch.report.compare import compare
    from normlab.launch.rundir.metrics import read_jsonl
    from normlab.launch.training.trainer import Trainer

    from tests.conftest import REPO, tiny_overrides

    runs = {}
    for name, peak in (("given", ["logging.peak_tflops=0.002"]), ("none", [])):
        run = tmp_path / name
        cfg = load_config(REPO / "recipes" / "pre.yaml", [*tiny_overrides(tiny_data, run), *peak])
        assert Trainer(cfg).run() == 0
        runs[name] = run
    fpt = flops_per_token(cfg.model_config(), cfg.data.seq_len)
    rows = [r for r in read_jsonl(runs["given"] / "metrics.jsonl") if "loss" in r]
    for r in rows:
        assert r["tflops_per_gpu"] == pytest.approx(r["tokens_per_s"] * fpt / 1e12)
        assert r["mfu"] == pytest.approx(r["tflops_per_gpu"] / 0.002)
    summary = json.loads((runs["given"] / "summary.json").read_text())
    assert summary["flops_per_token"] == fpt and summary["peak_tflops"] == 0.002
    assert summary["mfu"] == pytest.approx(summary["tokens_per_s"] * fpt / 1e12 / 0.002)
    bare = json.loads((runs["none"] / "summary.json").read_text())
    assert bare["mfu"] is None and bare["peak_tflops"] is None
    assert all("mfu" not in r for r in read_jsonl(runs["none"] / "metrics.jsonl"))
    capsys.readouterr()
    assert main(["status", str(runs["given"]), str(runs["none"])]) == 0
    out = capsys.readouterr().out
    assert f"MFU {100 * rows[-1]['mfu']:.1f}%" in out and "MFU -" in out
    table = {r["run"]: r for r in compare([runs["given"], runs["none"]], None)["rows"]}
    assert table["given"]["mfu"] == pytest.approx(100 * summary["mfu"])
    assert table["none"]["mfu"] is None


@pytest.mark.parametrize("value", ["0", "-5", "fast"])
def test_bad_peak_is_one_line(value: str, capsys) -> None:
    from normlab.launch.cli import main

    from tests.conftest import REPO

    assert main(["validate", str(REPO / "recipes/pre.yaml"), f"logging.peak_tflops={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "logging.peak_tflops" in err
