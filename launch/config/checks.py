"""Cross-field checks of a RunConfig: each names the keys involved and what is allowed."""

from __future__ import annotations

import math
import re
from typing import Any

from normlab.launch.config.instruments import (
    check_instruments,
    check_warning_checkpoints,
    check_warning_engine,
)
from normlab.launch.config.loader import find_non_finite, suggest
from normlab.launch.config.schema import RunConfig
from normlab.launch.errors import ConfigError
from normlab.launch.registry import ENGINES, OPTIMIZERS


def validate(cfg: RunConfig) -> None:
    """Cross-field checks; each names the keys involved and what is allowed."""
    _names(cfg)
    # data first: model.vocab_size defaults to data.vocab_size, so a bad one is named here
    _positive(cfg, ["data.vocab_size", "data.seq_len", "data.batch_size", "data.num_proc"])
    try:
        mc = cfg.model_config()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _positive(cfg, ["training.steps", "training.grad_accum", "training.log_every"])
    _positive(cfg, ["training.eval_batches", "checkpoint.keep_last"])
    _non_negative(cfg, ["training.eval_every", "checkpoint.every", "schedule.warmup_steps"])
    _non_negative(cfg, ["optim.weight_decay", "optim.grad_clip", "optim.z_loss"])
    _positive(cfg, ["precision.loss_scale_init", "precision.loss_scale_growth_interval"])
    if cfg.training.threads is not None:
        _positive(cfg, ["training.threads"])
    if not 0 <= cfg.training.seed <= SEED_MAX:  # numpy's and Python's seeders take 32 bits
        raise ConfigError(
            f"training.seed must lie in [0, {SEED_MAX}] (2**32 - 1), got {cfg.training.seed}"
        )
    if cfg.logging.peak_tflops is not None:
        _positive(cfg, ["logging.peak_tflops"])
    if not 0.0 < cfg.data.val_fraction < 1.0:  # every run evaluates, at least at the end
        raise ConfigError(f"data.val_fraction must lie in (0, 1), got {cfg.data.val_fraction}")
    _validate_sources(cfg)
    if cfg.data.seq_len > mc.max_seq_len:
        raise ConfigError(
            f"data.seq_len ({cfg.data.seq_len}) exceeds model.max_seq_len ({mc.max_seq_len})"
        )
    if mc.vocab_size < cfg.data.vocab_size:
        raise ConfigError(
            f"model.vocab_size ({mc.vocab_size}) is smaller than data.vocab_size "
            f"({cfg.data.vocab_size}): the embedding cannot hold every token id; remove "
            f"model.vocab_size (it defaults to the tokenizer's size) or set it >= "
            f"{cfg.data.vocab_size}"
        )
    bad = find_non_finite(cfg.to_dict())
    if bad is not None:
        raise ConfigError(f"{bad} must be a finite number, got {_lookup(cfg.to_dict(), bad)!r}")
    _validate_optim(cfg)
    _validate_schedule(cfg)
    _validate_engine(cfg)
    _validate_fp8(cfg)
    _validate_instruments(cfg)


SEED_MAX = 2**32 - 1


def _names(cfg: RunConfig) -> None:
    """Names and paths are never blank: an empty run_dir (or name, which makes runs/<name>)
    would put the run into the working directory or into runs/ itself."""
    values = {
        "name": cfg.name,
        "run_dir": cfg.run_dir,
        "data.dataset": cfg.data.dataset,
        "engine.deepspeed_config": cfg.engine.deepspeed_config,
    }
    wandb = getattr(cfg.logging, "wandb", None)
    if wandb is not None:  # W&B refuses a blank project or team name only once it starts
        values |= {"logging.wandb.project": wandb.project, "logging.wandb.entity": wandb.entity}
    for key, value in values.items():
        if value is not None and not value.strip():
            raise ConfigError(f"{key} must not be empty, got {value!r}")
    if cfg.name in (".", "..") or "/" in (cfg.name or "") or "\\" in (cfg.name or ""):
        raise ConfigError(
            f"name must be a plain name (no '/', not '.' or '..'; run_dir sets the location), "
            f"got {cfg.name!r}"
        )


SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a metric key: eval/<name>


def _validate_sources(cfg: RunConfig) -> None:
    sources = cfg.data.sources
    if sources is None:
        return
    if not sources:
        raise ConfigError("data.sources must list at least one {name, path, weight} (or be null)")
    if cfg.data.dataset != "bundled":
        raise ConfigError(
            "data.dataset and data.sources are both set: give one directory as data.dataset or "
            "a mixture as data.sources, not both"
        )
    seen: set[str] = set()
    for i, s in enumerate(sources):
        if not SOURCE_NAME.match(s.name) or s.name in seen:
            raise ConfigError(
                f"data.sources[{i}].name {s.name!r} must be unique and of letters, digits, '_', "
                "'.', '-' (it names the metrics eval/<name> and tokens/<name>)"
            )
        seen.add(s.name)
        if not (math.isfinite(s.weight) and s.weight > 0):
            raise ConfigError(
                f"data.sources[{i}].weight must be a finite number > 0, got {s.weight}"
            )


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _validate_instruments(cfg: RunConfig) -> None:
    """Names and each instrument's typed settings (launch.config.instruments), at load time."""
    for name, settings in cfg.instruments.items():
        if not isinstance(settings, dict | bool | None):
            raise ConfigError(
                f"instruments.{name} must be a mapping of settings, true or false, got {settings!r}"
            )
    check_instruments(cfg.instruments)
    check_warning_engine(cfg.instruments, cfg.engine.name)  # an action this engine cannot do
    check_warning_checkpoints(cfg.instruments, cfg.checkpoint.every)  # nothing to return to


def _validate_optim(cfg: RunConfig) -> None:
    o = cfg.optim
    if o.name not in OPTIMIZERS:
        raise ConfigError(f"unknown optim.name {o.name!r}{suggest(o.name, list(OPTIMIZERS))}")
    if o.lr <= 0 or o.eps <= 0:
        raise ConfigError(f"optim.lr and optim.eps must be > 0, got {o.lr} and {o.eps}")
    if not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas must lie in [0, 1), got {list(o.betas)}")
    if not 0.0 <= o.muon_momentum < 1.0:
        raise ConfigError(f"optim.muon_momentum must lie in [0, 1), got {o.muon_momentum}")
    if o.qk_clip is not None:
        _validate_qk_clip(cfg)


def _validate_qk_clip(cfg: RunConfig) -> None:
    q = cfg.optim.qk_clip
    assert q is not None
    if not (math.isfinite(q.tau) and q.tau > 0):
        raise ConfigError(f"optim.qk_clip.tau must be a finite number > 0, got {q.tau}")
    if not 0.0 <= q.alpha <= 1.0:
        raise ConfigError(f"optim.qk_clip.alpha must lie in [0, 1], got {q.alpha}")


def _validate_schedule(cfg: RunConfig) -> None:
    s, steps = cfg.schedule, cfg.training.steps
    if s.warmup_steps > steps:
        raise ConfigError(
            f"schedule.warmup_steps ({s.warmup_steps}) exceeds training.steps ({steps})"
        )
    if not 0.0 <= s.min_lr_ratio <= 1.0:
        raise ConfigError(f"schedule.min_lr_ratio must lie in [0, 1], got {s.min_lr_ratio}")
    if not 0.0 < s.decay_fraction <= 1.0:
        raise ConfigError(f"schedule.decay_fraction must lie in (0, 1], got {s.decay_fraction}")
    if s.kind == "wsd" and s.warmup_steps > steps - round(s.decay_fraction * steps):
        raise ConfigError(
            "schedule kind 'wsd': schedule.warmup_steps overlaps the decay phase "
            "(warmup_steps + decay_fraction * training.steps > training.steps)"
        )
    if s.kind == "vaswani" and s.warmup_steps == 0:
        raise ConfigError("schedule kind 'vaswani' needs schedule.warmup_steps > 0 (paper: 4000)")


def _validate_engine(cfg: RunConfig) -> None:
    e = cfg.engine
    if e.name not in ENGINES:
        raise ConfigError(f"unknown engine.name {e.name!r}{suggest(e.name, list(ENGINES))}")
    if e.name != "deepspeed" and e.deepspeed_config is not None:
        raise ConfigError("engine.deepspeed_config is only used with engine.name: deepspeed")
    if e.name == "single" and e.zero_stage != 0:
        raise ConfigError(
            f"engine.zero_stage {e.zero_stage} needs a sharding engine (fsdp or deepspeed); "
            "engine 'single' runs one process"
        )
    if e.name == "single" and e.activation_checkpointing:
        raise ConfigError("engine.activation_checkpointing needs engine.name: fsdp or deepspeed")
    if e.replicate < 1 or (e.replicate > 1 and e.name != "fsdp"):
        raise ConfigError(
            f"engine.replicate must be >= 1 and above 1 only with engine.name: fsdp (HSDP), got "
            f"{e.replicate} with engine {e.name!r}"
        )
    if e.grad_sync != "micro_batch" and e.name != "fsdp":
        raise ConfigError(
            f"engine.grad_sync {e.grad_sync!r} is an engine fsdp setting (engine {e.name!r}); "
            "allowed: micro_batch with any engine, step with engine.name: fsdp"
        )
    if cfg.checkpoint.async_ and e.name != "fsdp":
        raise ConfigError(
            f"checkpoint.async needs engine.name: fsdp (torch.distributed.checkpoint's async_save);"
            f" engine {e.name!r} saves synchronously (DeepSpeed 0.19.8's asynchronous writers "
            "fail on a normlab run: README, asynchronous checkpoints): set checkpoint.async: false"
        )
    if e.name == "deepspeed" and e.zero_stage not in (1, 2, 3):
        raise ConfigError(
            f"engine deepspeed needs engine.zero_stage 1, 2 or 3, got {e.zero_stage} "
            "(stage 0 is plain data parallelism: use engine.name: fsdp)"
        )


def _validate_fp8(cfg: RunConfig) -> None:
    """precision.fp8: the dtypes it runs with (the device, the torchao install and the layers
    its patterns match are checked by preflight, launch/engines/fp8.py)."""
    fp8 = cfg.precision.fp8
    if fp8 is None:
        return
    if cfg.precision.dtype == "fp16":
        raise ConfigError(
            "precision.fp8 runs with precision.dtype fp32 or bf16 (torchao's recipes), got fp16"
        )
    if not all(isinstance(p, str) and p.strip(".") for p in fp8.keep):
        raise ConfigError(
            f"precision.fp8.keep must list layer-name patterns such as 'head' or 'down_proj', "
            f"got {fp8.keep!r}"
        )


def _get(cfg: RunConfig, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def _positive(cfg: RunConfig, keys: list[str]) -> None:
    for key in keys:
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key} must be > 0, got {_get(cfg, key)}")


def _non_negative(cfg: RunConfig, keys: list[str]) -> None:
    for key in keys:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)}")
