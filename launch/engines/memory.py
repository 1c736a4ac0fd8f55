"""Per-rank memory of one training step, estimated from the recipe (what `normlab plan` prints).

Every term is bytes on one rank (model states as in Rajbhandari et al. 2020, ZeRO, section 3):
- parameters, gradients and optimizer state: the model's P parameters over the ranks that shard
  them. single: 1. ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the
  parameters, over all ranks. FSDP2 shards all three over its shard group (world / replicate).
  Mixed precision keeps fp32 master weights, gradients and moments (AdamW 2 per parameter; Muon 1
  for block matrices and AdamW's 2 for the rest).
- activations: what autograd keeps for the backward of one micro-batch, counted tensor by tensor
  for this decoder (`saved_per_token`, checked against torch's saved-tensor hooks in the tests),
  plus the two (B, T, V) fp32 tensors the loss backward holds at once. Activation checkpointing
  keeps each block's input and recomputes one block at a time.
- working set: what a sharded engine gathers around the block it computes (whole parameters of
  the root group and of two blocks, one block's whole gradient), DeepSpeed's gradient bucket, or
  the 16-bit weight copies single-process autocast keeps from forward to backward.
- step temporaries: the foreach AdamW/Muon step on CUDA allocates one fp32 intermediate per
  parameter shard; on the CPU it updates one tensor at a time.
- gradient accumulation (training.grad_accum > 1): the gradients a rank keeps between
  micro-batches are alive with the next micro-batch's activations. single and DeepSpeed keep their
  gradients (ZeRO-1 the module's whole 16-bit gradient, ZeRO-2/3 the partitions); FSDP2 keeps its
  fp32 shard when it reduce-scatters every micro-batch (engine.grad_sync micro_batch) and the
  whole unsharded fp32 gradient when it reduces once per step (grad_sync step).
- Muon on DeepSpeed gathers each matrix whole to its owner rank for Newton-Schulz: fp32 copies of
  the largest block matrix (the gathered update, X, X X^T and the polynomial) in the step.
- FP8 (precision.fp8, `fp8_working`): e4m3 casts of one layer at a time and their fp32 scales;
  fewer 16-bit weight copies (single autocast) or 1-byte gathered block matrices (fsdp,
  tensorwise float8 all-gather). torchao saves the same high-precision tensors for the backward
  as nn.Linear, so the activations do not change.
The peak of a steady step is static state + max(activations at the start of the backward plus
the gradients held from earlier micro-batches, gradients + step temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from normlab.model.config import ModelConfig
from normlab.model.presets import count_params, norm_params

EngineName = Literal["single", "fsdp", "deepspeed"]
WIDTH = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes of a parameter copy / activation element
GIB = 1 << 30
DS_BUCKET = 500_000_000  # DeepSpeed's default reduce bucket (elements)


@dataclass(frozen=True)
class Layout:
    """Where and how one rank trains: engine, ZeRO stage, ranks, micro-batch, precision."""

    engine: EngineName
    world: int = 1
    zero_stage: int = 0
    replicate: int = 1
    batch: int = 1  # sequences per micro-batch per rank
    seq_len: int = 256
    dtype: str = "fp32"
    checkpointing: bool = False
    optimizer: str = "adamw"
    cuda: bool = True
    grad_accum: int = 1  # micro-batches per step
    grad_sync: str = "micro_batch"  # fsdp: reduce-scatter every micro-batch, or once per "step"
    fp8: str | None = None  # precision.fp8.recipe (None: no FP8)
    fp8_gather: bool = True  # fsdp, tensorwise: torchao's float8 all-gather


@dataclass(frozen=True)
class Estimate:
    """Bytes per rank by kind; `total` is the peak of a steady-state step."""

    params: float
    grads: float
    optimizer: float
    activations: float
    working: float
    step_temp: float
    held: float = 0.0  # gradients kept between micro-batches (0 without accumulation)

    @property
    def total(self) -> float:
        static = self.params + self.optimizer + self.working
        return static + max(self.activations + self.held, self.grads + self.step_temp)


def root_params(cfg: ModelConfig) -> int:
    """Embedding, head (unless tied) and the norms outside the blocks."""
    embed = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    embed += 1 if cfg.norm in ("dyt", "derf") else 0  # their embedding scalar
    return embed + norm_params(cfg) * (int(cfg.has_final_norm) + int(cfg.embed_norm))


def block_params(cfg: ModelConfig) -> int:
    return (count_params(cfg) - root_params(cfg)) // cfg.n_layers


def matrix_params(cfg: ModelConfig) -> int:
    """Weights of the blocks' Linear layers (what Muon orthogonalises)."""
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.n_kv_heads * cfg.head_dim
    return cfg.n_layers * (2 * d * d + 2 * d * kv + (3 if cfg.mlp == "swiglu" else 2) * d * f)


def saved_per_token(cfg: ModelConfig) -> tuple[int, int]:
    """Elements autograd keeps per token: (one block, outside the blocks).

    A norm keeps its input, x-hat and 1/rms (layernorm, fused: input, mean, 1/std). A branch
    keeps its input (for its first Linear); attention q and k after RoPE, v, its output and one
    log-sum-exp per head (QK-norm: also raw q, k and their x-hat); SwiGLU gate, up, silu(gate)
    and their product (GELU 2 tensors of d_ff, ReLU 1). Peri-LN has two norms per sub-layer.
    """
    d, f, h = cfg.d_model, cfg.d_ff, cfg.n_heads
    kv = cfg.n_kv_heads * cfg.head_dim
    norm = d + 2 if cfg.norm == "layernorm" else 2 * d + 1
    attn = 3 * d + 2 * kv + h
    if cfg.qk_norm != "none":
        attn += 2 * (d + kv) + (h + cfg.n_kv_heads if cfg.qk_norm == "head" else 2)
    mlp = d + {"swiglu": 4, "gelu": 2, "relu": 1}[cfg.mlp] * f
    norms = 2 if cfg.placement == "peri" else 1
    block = attn + mlp + 2 * norms * norm
    outside = d + norm * (int(cfg.has_final_norm) + int(cfg.embed_norm))
    return block, outside


def activation_bytes(cfg: ModelConfig, lay: Layout) -> float:
    """Activations of one micro-batch at their peak, the start of the backward."""
    tokens = lay.batch * lay.seq_len
    block, outside = saved_per_token(cfg)
    per_token = cfg.n_layers * block
    if lay.checkpointing:  # block inputs, plus one block recomputed inside its backward
        per_token = cfg.n_layers * cfg.d_model + block
    width = WIDTH[lay.dtype]
    loss = 3 * cfg.vocab_size * 4  # fp32 log-softmax output, its gradient, the logits' gradient
    return tokens * ((per_token + outside) * width + loss + 2 * 8)  # + int64 inputs, targets


def shards(lay: Layout) -> tuple[int, int, int]:
    """Ways the parameters, gradients and optimizer state are divided on this layout."""
    if lay.engine == "single":
        return 1, 1, 1
    if lay.engine == "fsdp":
        s = lay.world // lay.replicate
        return s, s, s
    n = lay.world
    return {1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[lay.zero_stage]


def moments_per_param(cfg: ModelConfig, optimizer: str) -> float:
    """fp32 optimizer-state elements per parameter, on average."""
    if optimizer != "muon":
        return 2.0
    total, mats = count_params(cfg), matrix_params(cfg)
    return (mats + 2 * (total - mats)) / total


def estimate(cfg: ModelConfig, lay: Layout) -> Estimate:
    """Bytes per rank of each kind for `cfg` trained on `lay` (see the module docstring)."""
    p = float(count_params(cfg))
    p_sh, g_sh, o_sh = shards(lay)
    width, mixed = WIDTH[lay.dtype], lay.dtype != "fp32"
    blk, root = float(block_params(cfg)), float(root_params(cfg))
    params, grads = p / p_sh * 4, p / g_sh * 4
    optim = p / o_sh * 4 * moments_per_param(cfg, lay.optimizer)
    if lay.engine == "fsdp":
        working = (root + 2 * blk) * width + blk * (width + (4 if mixed else 0))
    elif lay.engine == "deepspeed":
        params, grads, working = _deepspeed(p, blk, root, lay)
    else:  # autocast keeps the 16-bit copy of every weight from forward to backward
        working = p * width if mixed else 0.0
    working += fp8_working(cfg, lay)
    largest = max(blk, cfg.vocab_size * cfg.d_model)
    step_temp = p / o_sh * 4 if lay.cuda else 2 * 4 * largest
    if lay.engine == "deepspeed" and lay.optimizer == "muon":
        step_temp += 4 * 4 * largest_matrix(cfg)
    held = held_gradients(p, grads, lay) if lay.grad_accum > 1 else 0.0
    return Estimate(params, grads, optim, activation_bytes(cfg, lay), working, step_temp, held)


def fp8_working(cfg: ModelConfig, lay: Layout) -> float:
    """Bytes precision.fp8 adds to the working set (negative: saves). The blocks' linear layers
    are converted (the head stays in high precision); torchao casts one layer at a time:
    - e4m3 copies (1 byte) of the largest converted weight (forward, and again in the backward),
      of its input and of its output gradient, with fp32 scales (2 per tensor for tensorwise; one
      per row for the rowwise recipes);
    - single with bf16/fp16 autocast: autocast's 16-bit weight copies of the converted layers,
      kept from forward to backward, are not made (Float8Linear casts its weight itself);
    - fsdp with tensorwise float8 all-gather: the two gathered blocks' matrices take 1 byte per
      element instead of the parameter width (their scales are negligible)."""
    if lay.fp8 is None:
        return 0.0
    tokens, wide = lay.batch * lay.seq_len, max(cfg.d_model, cfg.d_ff)
    scales = 4 * (tokens + wide if lay.fp8 != "tensorwise" else 2)
    transient = 2 * largest_matrix(cfg) + 2 * tokens * wide + 2 * scales
    width = WIDTH[lay.dtype]
    if lay.engine == "single" and lay.dtype != "fp32":
        return transient - matrix_params(cfg) * width
    if lay.engine == "fsdp" and lay.fp8 == "tensorwise" and lay.fp8_gather:
        return transient - 2 * matrix_params(cfg) / cfg.n_layers * (width - 1)
    return transient


def largest_matrix(cfg: ModelConfig) -> int:
    """Elements of the largest block matrix (what Muon orthogonalises whole)."""
    return max(cfg.d_model * cfg.d_ff, cfg.d_model * cfg.d_model)


def held_gradients(p: float, grads: float, lay: Layout) -> float:
    """Bytes of gradient a rank keeps from one micro-batch to the next (see the docstring)."""
    if lay.engine == "fsdp" and lay.grad_sync == "step":
        return p * 4  # unsharded, accumulated in fp32 (the reduce dtype) on every rank
    if lay.engine == "deepspeed" and lay.zero_stage == 1:
        return p * WIDTH[lay.dtype]  # the module's .grad, reduced only at the boundary
    return grads


def _deepspeed(p: float, blk: float, root: float, lay: Layout) -> tuple[float, float, float]:
    """(parameters, gradients, working set) of DeepSpeed ZeRO: the module holds 16-bit (or fp32)
    weights, the optimizer an fp32 master partition; gradients are reduced through a bucket."""
    n, width, stage = lay.world, WIDTH[lay.dtype], lay.zero_stage
    params = p * width / (n if stage == 3 else 1) + p / n * 4
    grads = p * width + p / n * 4 if stage == 1 else p / n * (width + 4)
    working = min(float(DS_BUCKET), p) * width
    if stage == 3:  # gathered weights around the computed block (prefetch included)
        working += (2 * blk + max(root / 2, blk)) * width
    return params, grads, working
