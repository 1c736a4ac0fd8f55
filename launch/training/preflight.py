"""Everything `normlab train` would refuse, checked before anything is created or started.

`train` (every rank), `validate` and `launch` (once, before torchrun) call `preflight`, so a
recipe that validates is a recipe that starts: instrument settings, the engine and its stage,
optional dependencies, the device, the DeepSpeed config, the dataset directory and its tokenizer
size against the model. Only the model itself is not built (validate counts it on `meta`).
"""

from __future__ import annotations

from pathlib import Path

from normlab.launch.config import RunConfig
from normlab.launch.config.instruments import check_instruments
from normlab.launch.errors import ConfigError
from normlab.launch.extras import require
from normlab.launch.rundir.directory import check_lock_settings
from normlab.launch.rundir.wandb_setup import check_wandb


def preflight(cfg: RunConfig, world_size: int = 1, local: bool = True) -> None:
    """Raise the ConfigError/DataError/MissingDependency that starting this run would raise.
    local=False (a job submitted to other machines) skips the checks of this host's devices."""
    check_instruments(cfg.instruments)  # names and settings, without importing the instruments
    check_lock_settings()  # NORMLAB_LOCK_STALE_S / _HEARTBEAT_S: numbers of seconds > 0
    # W&B: not installed or broken, refused WANDB_* settings, no credentials, damaged wandb.json
    check_wandb(cfg.logging.wandb, Path(cfg.run_dir or "runs/run"), credentials=local)
    _check_engine(cfg, world_size, local)
    check_dataset(cfg)


def _check_engine(cfg: RunConfig, world_size: int, local: bool) -> None:
    # 'cuda' without a GPU is an error here, not on a login node submitting to GPU nodes (which
    # checks no device, so `submit --dry-run` and `validate` need no torch for it)
    if local:
        from normlab.launch.engines.single import resolve_device

        device_type = resolve_device(cfg.training.device).type
    else:
        device_type = cfg.training.device
    if cfg.engine.name == "single" and world_size > 1:
        raise ConfigError(
            f"engine.name is 'single' but the launch asks for {world_size} processes; set "
            "engine.name=fsdp or engine.name=deepspeed (or use `normlab train`)"
        )
    if cfg.precision.fp8 is not None:
        from normlab.launch.engines.fp8 import check_fp8

        check_fp8(cfg, device_type, local)
    if world_size % cfg.engine.replicate:
        raise ConfigError(
            f"engine.replicate ({cfg.engine.replicate}) must divide the world size ({world_size} "
            "= nodes x processes per node); on several nodes, replicate = nodes is the usual HSDP"
        )
    if cfg.engine.name != "deepspeed":
        return
    require("deepspeed", "engine.name=deepspeed")
    from normlab.launch.engines.base import RunFacts
    from normlab.launch.engines.deepspeed_engine import ds_config

    # the generated config and engine.deepspeed_config
    ds_config(cfg.engine, cfg.precision, RunFacts.of(cfg), world_size)
    on_cpu = device_type == "cpu"
    if cfg.precision.dtype == "fp16" and on_cpu:
        raise ConfigError(
            "precision.dtype fp16 with engine deepspeed needs CUDA devices: DeepSpeed's CPU "
            "accelerator has no fp16 support; use bf16 or fp32 on CPU"
        )


def check_dataset(cfg: RunConfig) -> None:
    """Every prepared source must be complete, share one tokenizer, and fit model.vocab_size."""
    from normlab.launch.config.schema import source_entries

    entries = source_entries(cfg.data)
    keys = (
        [f"data.sources[{i}]" for i in range(len(entries))]
        if cfg.data.sources
        else ["data.dataset"]
    )
    # the bundled corpus is prepared into the cache on first use
    prepared = [(n, Path(p).expanduser(), w) for n, p, w in entries if p != "bundled"]
    keys = [k for k, e in zip(keys, entries, strict=True) if e[1] != "bundled"]
    if not prepared:
        return
    from normlab.data.mixture import SourceSpec, check_same_tokenizer  # imports torch (data/)
    from normlab.data.prepare import read_meta

    metas = [read_meta(path) for _, path, _ in prepared]  # DataError: missing or damaged
    if not metas:
        return
    check_same_tokenizer([SourceSpec(*e) for e in prepared], metas)
    tokens = int(metas[0]["vocab_size"])
    model_vocab = cfg.model_config().vocab_size
    if model_vocab < tokens:
        raise ConfigError(
            f"model.vocab_size ({model_vocab}) is smaller than the tokenizer of {keys[0]} "
            f"{prepared[0][1]} ({tokens} "
            f"pieces): remove model.vocab_size (it defaults to the tokenizer's size) or set "
            f"model.vocab_size={tokens}"
        )
    for key, (_, path, _), meta in zip(keys, prepared, metas, strict=True):
        for split, held in meta["tokens"].items():  # the loader cuts seq_len + 1 tokens per row
            if held < cfg.data.seq_len + 1:
                raise ConfigError(
                    f"the {split} split of {key} {path} holds {held} tokens, fewer than "
                    f"data.seq_len + 1 ({cfg.data.seq_len + 1}): lower data.seq_len, or prepare "
                    "more text (for val: a larger --val-fraction)"
                )
