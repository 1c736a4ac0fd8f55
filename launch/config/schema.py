"""Typed run configuration: one dataclass per recipe section, and the RunConfig that holds them.

Loading (`load_config`, in config/build.py) and the cross-field checks (config/checks.py) live
beside this file; each error is a `ConfigError` whose message names the dotted key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from normlab.launch.config.loader import to_plain
from normlab.model.config import (
    AttnGate,
    InitScheme,
    KeelAlpha,
    MlpKind,
    ModelConfig,
    NormBackend,
    NormKind,
    Parametrization,
    Placement,
    QKNorm,
    ResidualScale,
)


@dataclass
class ModelSection:
    """The recipe's `model:` section: `preset` (a name in model.presets) and every ModelConfig
    field, each None unless the recipe sets it (None: the preset's value, else ModelConfig's
    default). tests/launch/config/test_model_section.py holds it field for field to ModelConfig."""

    preset: str | None = None  # a size preset: tiny, 125m, 350m, 1b, 7b
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None  # None: one key/value head per query head (plain MHA)
    d_ff: int | None = None
    vocab_size: int | None = None  # None: the prepared data's tokenizer decides
    max_seq_len: int | None = None
    mlp: MlpKind | None = None
    smooth_swiglu: bool | None = None  # Smooth-SwiGLU (FP8; SCIENCE.md 24)
    norm: NormKind | None = None
    norm_eps: float | None = None
    norm_backend: NormBackend | None = None
    placement: Placement | None = None
    embed_norm: bool | None = None
    mix_ratio: float | None = None
    ln_scaling: bool | None = None
    qk_norm: QKNorm | None = None
    init: InitScheme | None = None  # None: model.config.default_init of the placement
    init_std: float | None = None
    tie_embeddings: bool | None = None
    bias: bool | None = None
    dropout: float | None = None
    rope_theta: float | None = None
    # attention stabilizers (SCIENCE.md 12-14)
    attn_gate: AttnGate | None = None
    attn_sinks: bool | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # norm-side stabilizers (SCIENCE.md 15-18)
    residual_scale: ResidualScale | None = None
    residual_scale_init: float | None = None
    dyt_alpha0: dict | None = None  # DyT/Derf α init per layer kind: {attn, ffn, final}
    keel_alpha: KeelAlpha | float | None = None
    # hyperparameter transfer (SCIENCE.md 21)
    parametrization: Parametrization | None = None  # sp | mup | completep
    base_d_model: int | None = None
    base_n_layers: int | None = None
    completep_alpha: float | None = None
    input_mult: float | None = None
    output_mult: float | None = None
    attn_mult: float | None = None
    d_head: int | None = None  # width ladders: n_heads = d_model / d_head
    d_ff_mult: float | None = None  # width ladders: d_ff = round(d_ff_mult * d_model)

    def to_model_config(self) -> ModelConfig:
        """The ModelConfig of the fields the recipe set (ModelConfig checks the combination)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        return ModelConfig(**{k: v for k, v in values.items() if v is not None})


@dataclass
class SourceSection:
    """One source of a data.sources mixture; `name` and `path` are required (the loader turns
    the TypeError of a missing one into one line naming the source and the key)."""

    name: str = ""  # a metric key: eval/<name>, tokens/<name>
    path: str = ""  # a `normlab prepare` directory, or 'bundled'
    weight: float = 1.0  # sampling probability per sequence (weights are normalised)

    def __post_init__(self) -> None:
        for key, what in (("name", "its metric name"), ("path", "a `normlab prepare` directory")):
            if not getattr(self, key):
                raise TypeError(
                    f"no '{key}' ({what}); each source is {{name, path, weight}}, e.g. "
                    "{name: web, path: data/web, weight: 0.7}"
                )


@dataclass
class DataSection:
    dataset: str = "bundled"  # 'bundled' (the shipped corpus) or a `normlab prepare` directory
    # a weighted mixture of prepared directories sharing one tokenizer (replaces data.dataset)
    sources: list[SourceSection] | None = None
    # tokenizer size. bundled: the size trained for it (None: 4096). A prepared directory:
    # None reads its meta.json; another value than the directory's is an error.
    vocab_size: int | None = None
    tokenizer: Literal["bpe", "unigram"] = "bpe"  # the bundled corpus's SentencePiece model type
    seq_len: int = 256  # tokens per training sequence
    batch_size: int = 16  # sequences per micro-batch per process
    num_proc: int = 2  # processes that tokenize the bundled corpus
    val_fraction: float = 0.005  # bundled: share held out for evaluation


def source_entries(cfg: DataSection) -> list[tuple[str, str, float]]:
    """(name, path, weight) of every source as configured; `data.dataset` is one source."""
    if cfg.sources:
        return [(s.name, s.path, s.weight) for s in cfg.sources]
    name = "bundled" if cfg.dataset == "bundled" else Path(cfg.dataset).name or "data"
    return [(name, cfg.dataset, 1.0)]


@dataclass
class QKClipSection:
    tau: float = 100.0  # threshold on each head's max pre-softmax logit (Kimi K2: 100)
    alpha: float = 0.5  # MHA: W_q^h *= gamma^alpha, W_k^h *= gamma^(1 - alpha)


@dataclass
class OptimSection:
    name: str = "adamw"  # a key of launch.registry.OPTIMIZERS
    lr: float = 3e-4  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.95)  # Adam's (beta1, beta2)
    eps: float = 1e-8  # Adam's epsilon
    weight_decay: float = 0.1  # never applied to norms, biases or embeddings
    grad_clip: float = 1.0  # global L2 norm; 0 disables clipping
    z_loss: float = 0.0  # coefficient of mean(logsumexp^2) (SCIENCE.md section 5)
    # name muon (SCIENCE.md 6): Muon on the hidden matrices, AdamW (lr, betas, eps) on the rest
    muon_scale: Literal["match_rms_adamw", "original"] = "match_rms_adamw"  # Moonlight or K. Jordan
    muon_momentum: float = 0.95  # Nesterov momentum of Muon
    muon_ns_dtype: Literal["bf16", "fp32"] = "bf16"  # Newton-Schulz precision (paper: bf16)
    qk_clip: QKClipSection | None = None  # QK-Clip after every step (SCIENCE.md 7), any optimizer


@dataclass
class ScheduleSection:
    # the lr's shape after the linear warm-up
    kind: Literal["cosine", "linear", "constant", "wsd", "inv_sqrt", "vaswani"] = "cosine"
    warmup_steps: int = 100  # linear warm-up from 0 to optim.lr
    decay_fraction: float = 0.2  # wsd: last fraction of the steps decays linearly
    min_lr_ratio: float = 0.1  # floor of cosine/linear/wsd as a fraction of optim.lr


@dataclass
class TrainingSection:
    steps: int = 1000  # optimizer steps
    grad_accum: int = 1  # micro-batches per optimizer step
    seed: int = 0  # initialisation, data order and dropout
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batches: int = 8  # validation batches per evaluation
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    log_every: int = 10  # steps between metric rows and instrument readings
    threads: int | None = None  # torch.set_num_threads on CPU; None keeps torch's default


@dataclass
class FP8Section:
    """FP8 matmuls in the hidden linear layers through torchao's float8 training (SCIENCE.md 24;
    launch/engines/fp8.py; extra normlab[fp8]). The weights stay in their training dtype."""

    # torchao's recipes: tensorwise (per-tensor scales), rowwise (per-row, power-of-two scales),
    # rowwise_with_gw_hp (rowwise, the weight gradient in high precision)
    recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = "tensorwise"
    # linear layers kept in high precision: a pattern matches a layer whose dotted name holds it
    # as whole parts ('head', 'down_proj', 'blocks.0'); the embedding is no linear layer (never
    # converted), the default keeps the output head out too; each pattern must match a layer
    keep: list[str] = field(default_factory=lambda: ["head"])
    # auto: emulated on CPU (real FP8 casts and scales, fp32 matmul), hardware FP8 on SM 8.9+;
    # on | off (YAML reads a bare on/off as true/false: the same)
    emulate: Literal["auto", "on", "off"] | bool = "auto"
    # engine fsdp, recipe tensorwise: all-gather the weights in FP8 (torchao)
    fsdp_float8_all_gather: bool = True
    # skip: leave in high precision the layers torchao's auto filter judges too small for FP8 to
    # pay (its H100 tables; torchtitan's auto_filter_small_kn); convert: every layer keep allows
    small_gemms: Literal["convert", "skip"] = "convert"


@dataclass
class PrecisionSection:
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast or parameter dtype
    loss_scale_init: float = 65536.0  # fp16 dynamic loss scaling: initial scale
    loss_scale_growth_interval: int = 2000  # fp16: steps without overflow per doubling
    fp8: FP8Section | None = None  # a mapping turns FP8 training on ({} takes every default)


@dataclass
class WandbSection:
    """Weights & Biases beside TensorBoard (training/wandb_logger.py; extra normlab[wandb])."""

    project: str = "normlab"  # W&B project
    entity: str | None = None  # W&B team or user; None: the logged-in default
    # offline: write <run>/wandb/ only, upload later with `wandb sync`; disabled: no W&B at all
    mode: Literal["online", "offline", "disabled"] = "online"
    tags: list[str] = field(default_factory=list)  # W&B run tags


@dataclass
class LoggingSection:
    tensorboard: bool = True  # TensorBoard events in <run>/tb
    jsonl: bool = True  # <run>/metrics.jsonl
    progress: bool = True  # live display; off automatically when stdout is not a terminal
    # dense peak TFLOP/s of one device for MFU (launch/training/mfu.py); None: looked up for
    # A100/H100/H200, and no MFU on a CPU or an unknown GPU
    peak_tflops: float | None = None
    wandb: WandbSection | None = None  # a mapping turns W&B on ({} takes every default)


@dataclass
class CheckpointSection:
    every: int = 500  # steps; 0: only the final checkpoint
    keep_last: int = 3  # checkpoints kept (wsd also keeps its stable-phase end)
    # recipe key `async`: write in the background while training goes on (engine fsdp)
    async_: bool = field(default=False, metadata={"key": "async"})


@dataclass
class EngineSection:
    name: str = "single"  # a key of launch.registry.ENGINES
    zero_stage: Literal[0, 1, 2, 3] = 0  # deepspeed: ZeRO stage
    activation_checkpointing: bool = False  # recompute each block in the backward pass
    compile: bool = False  # torch.compile every block
    # torch.compile backend: inductor (the speed-up), aot_eager or eager (debugging: dynamo
    # and autograd tracing without code generation)
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    # engine single: compile the whole model (model) or each block (blocks: one block's graph
    # serves every block, so compilation stays short at any depth; torchtitan's choice); the
    # sharded engines always compile each block
    compile_scope: Literal["model", "blocks"] = "model"
    # fsdp with grad_accum > 1: reduce-scatter gradients after every micro-batch ("micro_batch":
    # torchtitan's default, each rank keeps only its gradient shard) or once per step ("step":
    # one reduce-scatter, but every rank holds the whole unsharded fp32 gradient meanwhile)
    grad_sync: Literal["micro_batch", "step"] = "micro_batch"
    deepspeed_config: str | None = None  # a JSON file merged over the generated config
    replicate: int = 1  # fsdp: HSDP, shard within world/replicate ranks, replicate across groups


@dataclass
class RunConfig:
    name: str | None = None  # default: the recipe file's stem
    run_dir: str | None = None  # default: runs/<name>
    model: ModelSection = field(default_factory=ModelSection)
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
