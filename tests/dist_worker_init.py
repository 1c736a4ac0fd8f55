"""Worker of test_scale's init test (not a test module), run by torchrun on 2 gloo ranks.

`dist_worker_init.py OUT_DIR CHUNK`: for every init scheme, build the model the sharded ways
(FSDP2: meta device, fully_shard, materialise local shards; DeepSpeed ZeRO-3: zero.Init, draw
local partitions), gather the whole weights; rank 0 saves OUT_DIR/<engine>_<scheme>.pt.
CHUNK shrinks model.init.CHUNK so the shards cut through generator chunks.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import normlab.model.init as model_init
import torch
import torch.distributed as dist
from normlab.launch.engines.construct import build_on_meta, build_zero3, materialize
from normlab.launch.engines.deepspeed_engine import skip_shm_comm_build
from normlab.model import ModelConfig

SEED = 1234


def scheme_config(scheme: str) -> ModelConfig:
    """Every parameter kind: matrices, embedding, head, norm gains and biases, QK-norm gains."""
    return ModelConfig(
        n_layers=2,
        d_model=64,
        n_heads=4,
        d_ff=96,
        vocab_size=100,
        max_seq_len=16,
        norm="layernorm",
        bias=True,
        qk_norm="head",
        init=scheme,
        placement="deepnorm" if scheme == "deepnorm" else "pre",
    )


def norm_side_configs() -> dict[str, ModelConfig]:
    """The norm-side parameter kinds (SCIENCE.md 15-18): DyT/Derf alpha, shift, gain and bias,
    the embedding scalar, LayerScale and SkipInit scales, HybridNorm's N_v, Keel's two norms."""
    base = dict(n_layers=2, d_model=64, n_heads=4, d_ff=96, vocab_size=100, max_seq_len=16)
    return {
        "dyt_layerscale": ModelConfig(**base, norm="dyt", residual_scale="layerscale",
                                      qk_norm="head"),
        "derf_scalar": ModelConfig(**base, norm="derf", residual_scale="scalar",
                                   residual_scale_init=0.3),
        "hybrid_star": ModelConfig(**base, placement="hybrid_star", qk_norm="head",
                                   init="megatron_small"),
        "keel": ModelConfig(**base, placement="keel"),
    }


def all_configs() -> dict[str, ModelConfig]:
    return {scheme: scheme_config(scheme) for scheme in model_init.SCHEMES} | norm_side_configs()


def fsdp_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    module, plan = build_on_meta(cfg)
    for block in module.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    materialize(module, plan, SEED, torch.device("cpu"))
    return {k: v.full_tensor() for k, v in module.state_dict().items()}


def zero3_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    module = build_zero3(cfg, SEED, config)
    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


def main() -> None:
    out, model_init.CHUNK = Path(sys.argv[1]), int(sys.argv[2])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    skip_shm_comm_build()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    for scheme, cfg in all_configs().items():
        for engine, build in (("fsdp", fsdp_weights), ("zero3", zero3_weights)):
            weights = build(cfg)
            if dist.get_rank() == 0:
                torch.save(weights, out / f"{engine}_{scheme}.pt")
    dist.barrier()
    # the FSDP/DeepSpeed state built above sits in reference cycles that still hold the process
    # group: destroyed at interpreter exit, gloo aborts ('terminate called without an active
    # exception', seen under load). Collected first, as DistributedEngine.shutdown does.
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
