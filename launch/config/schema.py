"""Typed run configuration: one dataclass per component, loaded from YAML recipes.

`load_config("recipes/pre.yaml", ["optim.lr=3e-4"])` reads the recipe (with `base:` inheritance),
applies dotted overrides, expands `model.preset`, type-checks every key and checks cross-field
combinations. Each error is a `ConfigError` whose message names the dotted key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from normlab.launch.config.loader import (
    apply_overrides,
    build,
    deep_merge,
    find_non_finite,
    load_yaml,
    suggest,
    to_plain,
)
from normlab.launch.errors import ConfigError
from normlab.launch.registry import ENGINES, INSTRUMENTS, OPTIMIZERS
from normlab.model import ModelConfig
from normlab.model.presets import PRESETS


def _model_section() -> type:
    """ModelSection mirrors every ModelConfig field (None: take the preset's or the default)."""
    hints = typing.get_type_hints(ModelConfig)
    specs: list[Any] = [("preset", str | None, field(default=None))]
    for f in dataclasses.fields(ModelConfig):
        specs.append((f.name, hints[f.name] | None, field(default=None)))
    cls = dataclasses.make_dataclass("ModelSection", specs, namespace={"to_model_config": _to_mc})
    cls.__doc__ = "Model fields (see model.ModelConfig) plus `preset`, a name in model.presets."
    return cls


def _to_mc(self: Any) -> ModelConfig:
    values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in values.items() if v is not None})


ModelSection = _model_section()


@dataclass
class DataSection:
    dataset: str = "bundled"  # 'bundled' (the shipped corpus) or a `normlab prepare` directory
    # tokenizer size. bundled: the size trained for it (None: 4096). A prepared directory:
    # None reads its meta.json; another value than the directory's is an error.
    vocab_size: int | None = None
    tokenizer: Literal["bpe", "unigram"] = "bpe"
    seq_len: int = 256
    batch_size: int = 16  # sequences per micro-batch per process
    num_proc: int = 2
    val_fraction: float = 0.005


@dataclass
class QKClipSection:
    tau: float = 100.0  # threshold on each head's max pre-softmax logit (Kimi K2: 100)
    alpha: float = 0.5  # MHA: W_q^h *= gamma^alpha, W_k^h *= gamma^(1 - alpha)


@dataclass
class OptimSection:
    name: str = "adamw"  # a key of launch.registry.OPTIMIZERS
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1  # never applied to norms, biases or embeddings
    grad_clip: float = 1.0  # global L2 norm; 0 disables clipping
    z_loss: float = 0.0  # coefficient of mean(logsumexp^2) (SCIENCE.md section 5)
    # name muon (SCIENCE.md 6): Muon on the hidden matrices, AdamW (lr, betas, eps) on the rest
    muon_scale: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    muon_momentum: float = 0.95  # Nesterov momentum of Muon
    muon_ns_dtype: Literal["bf16", "fp32"] = "bf16"  # Newton-Schulz precision (paper: bf16)
    qk_clip: QKClipSection | None = None  # QK-Clip after every step (SCIENCE.md 7), any optimizer


@dataclass
class ScheduleSection:
    kind: Literal["cosine", "linear", "constant", "wsd", "inv_sqrt", "vaswani"] = "cosine"
    warmup_steps: int = 100
    decay_fraction: float = 0.2  # wsd: last fraction of the steps decays linearly
    min_lr_ratio: float = 0.1  # floor of cosine/linear/wsd as a fraction of optim.lr


@dataclass
class TrainingSection:
    steps: int = 1000  # optimizer steps
    grad_accum: int = 1
    seed: int = 0
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batches: int = 8
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = 10
    threads: int | None = None  # torch.set_num_threads on CPU; None keeps torch's default


@dataclass
class PrecisionSection:
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    loss_scale_init: float = 65536.0  # fp16 dynamic loss scaling: initial scale
    loss_scale_growth_interval: int = 2000


@dataclass
class LoggingSection:
    tensorboard: bool = True
    jsonl: bool = True
    progress: bool = True  # live display; off automatically when stdout is not a terminal


@dataclass
class CheckpointSection:
    every: int = 500  # steps; 0: only the final checkpoint
    keep_last: int = 3
    # recipe key `async`: write in the background while training goes on (engine fsdp)
    async_: bool = field(default=False, metadata={"key": "async"})


@dataclass
class EngineSection:
    name: str = "single"  # a key of launch.registry.ENGINES
    zero_stage: Literal[0, 1, 2, 3] = 0
    activation_checkpointing: bool = False
    compile: bool = False
    deepspeed_config: str | None = None
    replicate: int = 1  # fsdp: HSDP, shard within world/replicate ranks, replicate across groups


@dataclass
class RunConfig:
    name: str | None = None  # default: the recipe file's stem
    run_dir: str | None = None  # default: runs/<name>
    model: ModelSection = field(default_factory=ModelSection)  # type: ignore[valid-type]
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    engine: EngineSection = field(default_factory=EngineSection)
    instruments: dict[str, Any] = field(default_factory=dict)  # callbacks by name -> settings

    def model_config(self) -> ModelConfig:
        return self.model.to_model_config()

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def load_config(recipe: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Recipe file + dotted overrides -> a validated RunConfig."""
    data = apply_overrides(load_yaml(recipe), overrides or [])
    data.setdefault("name", Path(recipe).stem)
    return from_dict(data)


def from_dict(data: dict[str, Any]) -> RunConfig:
    data = dict(data)
    data["model"] = expand_preset(data.get("model"))
    cfg = build(RunConfig, data)
    if cfg.run_dir is None:
        cfg.run_dir = str(Path("runs") / (cfg.name or "run"))
    # fp16 clamping switches itself on in fp16 unless a recipe sets it (SCIENCE.md section 9)
    cfg.instruments.setdefault("fp16_clamp", {"mode": "auto"})
    resolve_vocab(cfg)
    validate(cfg)
    return cfg


BUNDLED_VOCAB = 4096  # tokenizer size trained for the bundled corpus


def expand_preset(model: Any) -> Any:
    """Explicit model fields override the preset's; everything else comes from ModelConfig."""
    if not isinstance(model, dict):
        return model
    preset = model.get("preset")
    if preset is None:
        return model
    if preset not in PRESETS:
        raise ConfigError(f"unknown model.preset {preset!r}{suggest(str(preset), list(PRESETS))}")
    # a preset's vocabulary is only an example: the model follows the data's tokenizer
    sizes = {k: v for k, v in PRESETS[preset].items() if k != "vocab_size"}
    return deep_merge(sizes, model)


def resolve_vocab(cfg: RunConfig) -> None:
    """Fill data.vocab_size from the prepared directory (or 4096 for the bundled corpus) and
    model.vocab_size from data.vocab_size when the recipe leaves them unset."""
    d = cfg.data
    prepared = prepared_vocab_size(d.dataset)
    if prepared is not None:
        if d.vocab_size not in (None, prepared):
            raise ConfigError(
                f"data.vocab_size is {d.vocab_size} but data.dataset {d.dataset} was prepared "
                f"with a {prepared}-piece tokenizer: remove data.vocab_size (the prepared "
                f"directory decides), or prepare it again with --vocab-size {d.vocab_size}"
            )
        d.vocab_size = prepared
    elif d.vocab_size is None:
        d.vocab_size = BUNDLED_VOCAB
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = d.vocab_size


def prepared_vocab_size(dataset: str) -> int | None:
    """The tokenizer size in <dataset>/meta.json; None for 'bundled' or an unreadable directory
    (the trainer's dataset check then names what is wrong with it)."""
    if dataset == "bundled":
        return None
    try:
        size = json.loads((Path(dataset).expanduser() / "meta.json").read_text())["vocab_size"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def validate(cfg: RunConfig) -> None:
    """Cross-field checks; each names the keys involved and what is allowed."""
    try:
        mc = cfg.model_config()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _positive(cfg, ["data.vocab_size", "data.seq_len", "data.batch_size", "data.num_proc"])
    _positive(cfg, ["training.steps", "training.grad_accum", "training.log_every"])
    _positive(cfg, ["training.eval_batches", "checkpoint.keep_last"])
    _non_negative(cfg, ["training.eval_every", "checkpoint.every", "schedule.warmup_steps"])
    _non_negative(cfg, ["optim.weight_decay", "optim.grad_clip", "optim.z_loss"])
    _positive(cfg, ["precision.loss_scale_init", "precision.loss_scale_growth_interval"])
    if cfg.training.threads is not None:
        _positive(cfg, ["training.threads"])
    if not 0.0 < cfg.data.val_fraction < 1.0:  # every run evaluates, at least at the end
        raise ConfigError(f"data.val_fraction must lie in (0, 1), got {cfg.data.val_fraction}")
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
    _validate_instruments(cfg)


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _validate_instruments(cfg: RunConfig) -> None:
    for name, settings in cfg.instruments.items():
        if name not in INSTRUMENTS:
            hint = suggest(str(name), list(INSTRUMENTS), "instruments.")
            raise ConfigError(f"unknown instrument 'instruments.{name}'{hint}")
        if not isinstance(settings, dict | bool | None):
            raise ConfigError(
                f"instruments.{name} must be a mapping of settings, true or false, got {settings!r}"
            )


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
    if cfg.engine.compile:
        raise ConfigError(
            "optim.qk_clip needs each attention's per-head max logit, which a compiled block "
            "does not hand back: set engine.compile: false"
        )


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
