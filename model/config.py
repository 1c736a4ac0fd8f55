"""Typed, validated configuration of the decoder (one field per architectural choice)."""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args, get_origin

Placement = Literal[
    "post", "pre", "peri", "olmo2", "deepnorm", "mix", "hybrid", "hybrid_star", "keel",
    "ln_scaling",
]
NormKind = Literal["layernorm", "rmsnorm", "dyt", "derf"]
NormBackend = Literal["torch", "triton", "auto"]
MlpKind = Literal["swiglu", "gelu", "relu"]
QKNorm = Literal["none", "head", "flat"]
InitScheme = Literal["gpt2", "normal", "olmo2", "deepnorm", "xavier", "megatron_small"]
AttnGate = Literal["none", "headwise", "elementwise"]
ResidualScale = Literal["none", "layerscale", "scalar"]
KeelAlpha = Literal["sublayers", "blocks"]
Parametrization = Literal["sp", "mup", "completep"]

POINTWISE_NORMS = ("dyt", "derf")  # norm-free point-wise layers (SCIENCE.md 16)
DYT_ROLES = ("attn", "ffn", "final")  # the three kinds of DyT/Derf layer, each with its alpha0
# Placements whose branch can end in a residual scale (SCIENCE.md 15; mix: its pre blocks only)
RESIDUAL_SCALED = ("pre", "peri", "olmo2", "mix")

# Placements that end with a norm before the output head (SCIENCE.md section 1).
FINAL_NORM = {
    "post": False,
    "pre": True,
    "ln_scaling": True,  # Pre-LN's final norm
    "peri": True,
    "olmo2": True,
    "deepnorm": False,
    "mix": True,
    "hybrid": True,  # the reference (OLMo) applies ln_f unconditionally
    "hybrid_star": True,
    "keel": False,  # every sub-layer already ends in N_out
}


@dataclass
class ModelConfig:
    """Every architectural switch of a normlab decoder; invalid combinations raise ValueError."""

    n_layers: int = 4  # blocks
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # query heads (d_model / n_heads: the head dim, even for RoPE)
    n_kv_heads: int | None = None  # None: one key/value head per query head (plain MHA)
    d_ff: int = 512  # hidden width of the MLP
    vocab_size: int = 4096  # rows of the embedding and the output head
    max_seq_len: int = 256  # longest sequence the RoPE tables cover
    mlp: MlpKind = "swiglu"  # the MLP's activation (swiglu: gated, three matrices)
    # Smooth-SwiGLU (Fishman et al. 2024; SCIENCE.md 24): a per-channel power-of-two scale on the
    # SwiGLU product before the down projection's FP8 cast, undone in its weight (mlp swiglu only)
    smooth_swiglu: bool = False
    norm: NormKind = "rmsnorm"  # every norm's kind; dyt/derf: point-wise (SCIENCE.md 16)
    norm_eps: float = 1e-6  # epsilon inside every norm
    norm_backend: NormBackend = "torch"  # triton: fused kernels (CUDA); auto: triton on CUDA
    placement: Placement = "pre"  # where the norms sit in a block (SCIENCE.md section 1)
    embed_norm: bool = False  # peri: also normalise the embedding output
    mix_ratio: float = 0.25  # mix: share of the first blocks that are post-norm
    ln_scaling: bool = False  # the older spelling of placement: ln_scaling (with placement: pre)
    qk_norm: QKNorm = "none"  # QK-Norm: per head, or flat over all heads
    init: InitScheme | None = None  # None: default_init (deepnorm; normal for ln_scaling; gpt2)
    init_std: float = 0.02  # std of the normal initialisations
    tie_embeddings: bool = False  # the output head shares the embedding matrix
    bias: bool = False  # biases in the linear layers
    dropout: float = 0.0  # dropout on attention and branch outputs
    rope_theta: float = 10000.0  # RoPE base frequency
    # attention stabilizers (SCIENCE.md 12-14)
    attn_gate: AttnGate = "none"  # sigmoid gate on the SDPA output, per head or per channel
    attn_sinks: bool = False  # a learned logit per query head in the softmax denominator
    attn_softcap: float | None = None  # c * tanh(S / c) on the attention logits (Gemma 2: 50)
    final_softcap: float | None = None  # c * tanh(z / c) on the output logits (Gemma 2: 30)
    # norm-side stabilizers (SCIENCE.md 15-18)
    residual_scale: ResidualScale = "none"  # x + λ ⊙ F(.): per channel (CaiT) or one scalar
    residual_scale_init: float | None = None  # None: CaiT's depth rule (layerscale), 0 (scalar)
    dyt_alpha0: dict = field(default_factory=lambda: dict.fromkeys(DYT_ROLES, 0.5))
    keel_alpha: KeelAlpha | float = "sublayers"  # Keel's α: 2 * n_layers, n_layers, or a number
    # hyperparameter transfer (SCIENCE.md 21; model/parametrization.py): factors relative to the
    # base shape, so the base model is the sp model
    parametrization: Parametrization = "sp"
    base_d_model: int | None = None  # mup, completep: the width m_N = d_model / base_d_model
    base_n_layers: int | None = None  # completep: the depth m_L = n_layers / base_n_layers
    completep_alpha: float | None = None  # residual m_L^-α: 1 (CompleteP, default) or 0.5
    input_mult: float | None = None  # α_in on the embedding (default 1)
    output_mult: float | None = None  # α_out: head input × α_out / m_N (default 1)
    attn_mult: float | None = None  # α_attn: logits α_attn q·k / d_head (default sqrt(d_head))
    # width ladders (one grid key, model.d_model): when set, n_heads = d_model / d_head and
    # d_ff = round(d_ff_mult * d_model) replace the given n_heads / d_ff
    d_head: int | None = None
    d_ff_mult: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), _hint(f.name))
        self._derive_width()
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.ln_scaling and self.placement not in ("pre", "ln_scaling"):
            raise ValueError(
                f"model.ln_scaling is defined only for placement 'pre' (SCIENCE.md section 1), "
                f"got placement '{self.placement}'; allowed: placement: ln_scaling"
            )
        if self.placement == "ln_scaling" or self.ln_scaling:  # one name, both spellings
            self.placement, self.ln_scaling = "ln_scaling", True
        if self.init is None:
            self.init = default_init(self.placement, self.parametrization)
        self._check_combinations()
        self._check_norm_side()
        check_parametrization(self)
        if self.residual_scale_init is None and self.residual_scale != "none":
            self.residual_scale_init = (
                cait_epsilon(self.n_layers) if self.residual_scale == "layerscale" else 0.0
            )

    def _derive_width(self) -> None:
        """n_heads from d_head and d_ff from d_ff_mult, when set (a width ladder's one key)."""
        if self.d_head is not None:
            if self.d_head < 1 or self.d_model % self.d_head:
                raise ValueError(
                    f"model.d_head ({self.d_head}) must divide model.d_model ({self.d_model})"
                )
            kv_ratio = None if self.n_kv_heads is None else self.n_heads // self.n_kv_heads
            self.n_heads = self.d_model // self.d_head
            if kv_ratio is not None:
                self.n_kv_heads = max(1, self.n_heads // kv_ratio)
        if self.d_ff_mult is not None:
            if not self.d_ff_mult > 0:
                raise ValueError(f"model.d_ff_mult must be > 0, got {self.d_ff_mult}")
            self.d_ff = max(1, round(self.d_ff_mult * self.d_model))

    def _check_combinations(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by "
                f"model.n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads "
                f"({self.n_kv_heads}); allowed n_kv_heads: {_divisors(self.n_heads)}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head dim d_model/n_heads = {self.head_dim} must be even for RoPE")
        if self.embed_norm and self.placement != "peri":
            raise ValueError(
                f"model.embed_norm belongs to placement 'peri', got placement '{self.placement}'"
            )
        if (self.init == "deepnorm") != (self.placement == "deepnorm"):
            raise ValueError(
                "model.init 'deepnorm' and model.placement 'deepnorm' go together: its alpha "
                f"and beta are derived for that placement (got init={self.init!r}, "
                f"placement={self.placement!r})"
            )
        if self.smooth_swiglu and self.mlp != "swiglu":
            raise ValueError(
                f"model.smooth_swiglu rescales the SwiGLU product: it needs model.mlp 'swiglu', "
                f"got {self.mlp!r}"
            )
        if not 0.0 <= self.mix_ratio <= 1.0:
            raise ValueError(f"model.mix_ratio must lie in [0, 1], got {self.mix_ratio}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must lie in [0, 1), got {self.dropout}")
        for name in ("norm_eps", "init_std", "rope_theta"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")
        for name in ("attn_softcap", "final_softcap"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(
                    f"model.{name} must be a cap > 0 (Gemma 2: attention 50, final 30) or null "
                    f"for none, got {getattr(self, name)}"
                )

    def _check_norm_side(self) -> None:
        """The residual scales, DyT/Derf, HybridNorm and Keel (SCIENCE.md 15-18)."""
        if self.residual_scale != "none":
            if self.placement not in RESIDUAL_SCALED:
                raise ValueError(
                    f"model.residual_scale needs the scale to be the last thing on the branch: "
                    f"allowed placements {', '.join(RESIDUAL_SCALED)} (mix: its pre blocks); "
                    f"got placement {self.placement!r}"
                )
        elif self.residual_scale_init is not None:
            raise ValueError(
                "model.residual_scale_init is set but model.residual_scale is 'none'; "
                "allowed: residual_scale: layerscale | scalar"
            )
        if self.norm in POINTWISE_NORMS:
            if self.placement != "pre":
                raise ValueError(
                    f"model.norm {self.norm!r} replaces the norms of placement 'pre' only (as its "
                    f"references are tested), got placement {self.placement!r}"
                )
            if self.norm_backend == "triton":
                raise ValueError(
                    f"model.norm_backend 'triton' has no {self.norm} kernel; allowed with "
                    f"norm {self.norm!r}: torch, auto"
                )
        # a partial mapping (`model.dyt_alpha0.attn=0.8`) keeps the others at their default
        if isinstance(self.dyt_alpha0, dict) and set(self.dyt_alpha0) <= set(DYT_ROLES):
            self.dyt_alpha0 = dict.fromkeys(DYT_ROLES, 0.5) | self.dyt_alpha0
        if sorted(self.dyt_alpha0) != sorted(DYT_ROLES) or not all(
            _matches(v, float) and v > 0 for v in self.dyt_alpha0.values()
        ):
            raise ValueError(
                f"model.dyt_alpha0 must map each of {', '.join(DYT_ROLES)} to a number > 0, "
                f"got {self.dyt_alpha0!r}"
            )
        if self.norm not in POINTWISE_NORMS and self.dyt_alpha0 != dict.fromkeys(DYT_ROLES, 0.5):
            raise ValueError(f"model.dyt_alpha0 belongs to norm dyt | derf, got norm {self.norm!r}")
        if self.placement in ("hybrid", "hybrid_star") and self.qk_norm != "head":
            raise ValueError(
                f"placement {self.placement!r} normalises q, k and v per head: it needs "
                f"model.qk_norm 'head', got {self.qk_norm!r}"
            )
        if isinstance(self.keel_alpha, float | int) and self.keel_alpha <= 0:
            raise ValueError(
                f"model.keel_alpha must be 'sublayers', 'blocks' or a number > 0, "
                f"got {self.keel_alpha}"
            )
        if self.placement != "keel" and self.keel_alpha != "sublayers":
            raise ValueError(
                f"model.keel_alpha belongs to placement 'keel', got placement {self.placement!r}"
            )

    def notes(self) -> list[str]:
        """What a user should know about a valid combination (printed by `normlab validate`
        through parametrization.config_notes, which adds the transfer factors)."""
        out = []
        if self.residual_scale != "none" and self.init in ("gpt2", "megatron_small"):
            out.append(
                f"model.residual_scale {self.residual_scale} (init {self.residual_scale_init:g}) "
                f"and init {self.init}'s 1/sqrt(2L) output projections both shrink the branch "
                "(SCIENCE.md 15); init: normal keeps only the scale"
            )
        return out

    @property
    def keel_alpha_value(self) -> float:
        """Keel's residual weight α: the number of sub-layers (2L), of blocks (L), or as given."""
        named = {"sublayers": 2 * self.n_layers, "blocks": self.n_layers}
        return float(named.get(self.keel_alpha, self.keel_alpha))  # type: ignore[arg-type]

    @property
    def has_v_norm(self) -> bool:
        """HybridNorm's N_v (per head, like `head` QK-Norm) on the values."""
        return self.placement in ("hybrid", "hybrid_star")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_post_blocks(self) -> int:
        """Mix-LN: the first floor(mix_ratio * L) blocks are Post-LN, the rest Pre-LN."""
        return math.floor(self.mix_ratio * self.n_layers) if self.placement == "mix" else 0

    @property
    def has_final_norm(self) -> bool:
        return FINAL_NORM[self.placement]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                raise ValueError(f"unknown model key {key!r}{_suggest(key, known)}")
        return cls(**values)


def default_init(placement: str, parametrization: str = "sp") -> str:
    """The init a placement gets unless the recipe names one (SCIENCE.md section 2): DeepNorm's
    own; plain N(0, init_std) under LayerNorm Scaling, whose authors found depth-scaled init
    cancels its benefit, and under µP/CompleteP (their σ_base, SCIENCE.md 21.1); GPT-2's
    depth-scaled init otherwise."""
    if placement == "deepnorm":
        return "deepnorm"
    return "normal" if placement == "ln_scaling" or parametrization != "sp" else "gpt2"


# Inits with a width-free σ_base that µP rescales (SCIENCE.md 21.1: not GPT-2's 1/sqrt(2L))
TRANSFER_INITS = ("normal", "olmo2")
# Placements CompleteP's residual multiplier is defined for (SCIENCE.md 21.3)
DEPTH_PLACEMENTS = ("pre", "peri", "olmo2")


def check_parametrization(cfg: ModelConfig) -> None:
    """The base shape and the placements µP and CompleteP are defined for (SCIENCE.md 21.3)."""
    p = cfg.parametrization
    transfer_keys = (
        "base_d_model",
        "base_n_layers",
        "completep_alpha",
        "input_mult",
        "output_mult",
        "attn_mult",
    )
    if p == "sp":
        for key in transfer_keys:
            if getattr(cfg, key) is not None:
                raise ValueError(
                    f"model.{key} belongs to model.parametrization mup | completep, got sp"
                )
        return
    needs = ("base_d_model", "base_n_layers") if p == "completep" else ("base_d_model",)
    for key in needs:
        if getattr(cfg, key) is None or getattr(cfg, key) < 1:
            raise ValueError(
                f"model.parametrization {p} needs model.{key} (an integer >= 1: the base shape "
                f"the hyperparameters were tuned at), got {getattr(cfg, key)!r}"
            )
    if p == "mup" and cfg.base_n_layers is not None:
        raise ValueError("model.base_n_layers belongs to model.parametrization completep, got mup")
    if cfg.completep_alpha is not None and (
        p != "completep" or cfg.completep_alpha not in (1, 0.5)
    ):
        raise ValueError(
            f"model.completep_alpha must be 1 or 0.5 under parametrization completep, "
            f"got {cfg.completep_alpha!r} under {p}"
        )
    for key in ("input_mult", "output_mult", "attn_mult"):
        if getattr(cfg, key) is not None and getattr(cfg, key) <= 0:
            raise ValueError(f"model.{key} must be > 0, got {getattr(cfg, key)}")
    if cfg.init not in TRANSFER_INITS:
        raise ValueError(
            f"model.init must be {' | '.join(TRANSFER_INITS)} under parametrization {p} "
            f"(σ_base without depth or fan-in factors, SCIENCE.md 21.1), got {cfg.init!r}"
        )
    if p == "completep":
        _check_depth_rule(cfg)


def _check_depth_rule(cfg: ModelConfig) -> None:
    """CompleteP's m_L^-α is refused where SCIENCE.md 21.3 leaves it undefined."""
    if cfg.placement == "ln_scaling":
        raise ValueError(
            "model.placement 'ln_scaling' is itself a depth rule: refused with parametrization "
            "completep (SCIENCE.md 21.3); allowed: ln_scaling with mup"
        )
    if cfg.placement not in DEPTH_PLACEMENTS:
        raise ValueError(
            f"model.placement {cfg.placement!r} has no CompleteP depth rule (SCIENCE.md 21.3); "
            f"allowed with parametrization completep: {', '.join(DEPTH_PLACEMENTS)} (mup: any)"
        )
    if cfg.residual_scale != "none":
        raise ValueError(
            f"model.residual_scale {cfg.residual_scale!r} and CompleteP's m_L^-α both set the "
            "branch scale: refused with parametrization completep (SCIENCE.md 21.3)"
        )
    if cfg.norm in POINTWISE_NORMS:
        raise ValueError(
            f"model.norm {cfg.norm!r} has µP width rules only: refused with parametrization "
            "completep (SCIENCE.md 21.3); allowed: layernorm, rmsnorm"
        )


def cait_epsilon(n_layers: int) -> float:
    """CaiT's LayerScale init: 0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper (SCIENCE.md 15)."""
    return 0.1 if n_layers <= 18 else 1e-5 if n_layers <= 24 else 1e-6


@functools.cache
def _hints() -> dict[str, Any]:
    """ModelConfig's field annotations, evaluated once (each evaluation compiles every string
    annotation: per field and per config it was half the time of planning a study)."""
    return typing.get_type_hints(ModelConfig)


def _hint(name: str) -> Any:
    return _hints()[name]


def _check_type(name: str, value: Any, hint: Any) -> None:
    """Reject a value whose type does not match the field's annotation, naming the field."""
    if _matches(value, hint):
        return
    allowed = _describe(hint)
    raise ValueError(f"model.{name} must be {allowed}, got {value!r}")


def _matches(value: Any, hint: Any) -> bool:
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:  # NaN and infinity are never a setting
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if hint is float:
        return "a finite number"
    return "None" if hint is type(None) else f"of type {hint.__name__}"


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(known)}"


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# Wrapper kinds whose sub-layers carry a residual scale (model.placements.SCALED_WRAPPERS, built
# as ScaledResidual; kept here, without torch, so presets.count_params and `normlab plan` need no
# torch).
SCALED_KINDS = frozenset({"pre", "peri", "olmo2"})


def sublayer_kind(cfg: ModelConfig, layer: int) -> str:
    """The wrapper kind of block `layer` (1-based): Mix-LN resolves to post or pre by depth."""
    if cfg.placement == "mix":
        return "post" if layer <= cfg.n_post_blocks else "pre"
    if cfg.placement == "hybrid_star":  # HybridNorm*: block 1 is Pre-LN (with QKV-norm)
        return "pre" if layer == 1 else "hybrid"
    return cfg.placement
