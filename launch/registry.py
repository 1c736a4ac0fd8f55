"""Components by recipe name (a leaf: imports nothing of launch).

Each table maps the name a recipe uses to "module:attribute". The config checks names here
without importing any component (so launch.config stays a leaf); the trainer imports a
component only when a run uses it (DeepSpeed, for one, is heavy and optional).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

ENGINES = {
    "single": "normlab.launch.engines.single:SingleEngine",
    "fsdp": "normlab.launch.engines.fsdp:FSDPEngine",
    "deepspeed": "normlab.launch.engines.deepspeed_engine:DeepSpeedEngine",
}

# factory(model, OptimSection) -> torch.optim.Optimizer
OPTIMIZERS = {
    "adamw": "normlab.launch.optim:build_adamw",
    "muon": "normlab.launch.optim:build_muon",
}

# factory(settings dict) -> Callback; the name is also the key of its state in checkpoints.
INSTRUMENTS = {
    "activations": "normlab.launch.instruments.activations:ActivationStats",
    "gradients": "normlab.launch.instruments.gradients:GradientStats",
    "attention_logits": "normlab.launch.instruments.attention:AttentionLogits",
    "qk_gains": "normlab.launch.instruments.attention:QKGains",
    "spike_score": "normlab.launch.instruments.spikes:SpikeScore",
    "update_spikes": "normlab.launch.instruments.updates:UpdateSpikes",
    "spike_policy": "normlab.launch.instruments.policy:SpikePolicy",
    "fp16_clamp": "normlab.launch.instruments.fp16:FP16Clamp",
    "attention_stabilizers": "normlab.launch.instruments.stabilizers:AttentionStabilizers",
    "norm_stabilizers": "normlab.launch.instruments.norm_stabilizers:NormStabilizers",
    "init_loss": "normlab.launch.instruments.output_logits:InitLoss",
    "output_logits": "normlab.launch.instruments.output_logits:OutputLogits",
    "early_warning": "normlab.launch.instruments.early_warning:EarlyWarning",
    "adam_state": "normlab.launch.instruments.adam_state:AdamState",
    "qk_spectrum": "normlab.launch.instruments.qk_spectrum:QKSpectrum",
    "kurtosis": "normlab.launch.instruments.kurtosis:ActivationKurtosis",
    "attn_entropy": "normlab.launch.instruments.attention_entropy:AttentionEntropy",
    "fp8": "normlab.launch.instruments.fp8:FP8Stats",
}

# Each instrument's settings dataclass (launch.config.instruments); one not named here takes none.
INSTRUMENT_SETTINGS = {
    "attention_logits": "normlab.launch.config.instruments:AttentionLogitsSettings",
    "spike_score": "normlab.launch.config.instruments:SpikeScoreSettings",
    "update_spikes": "normlab.launch.config.instruments:UpdateSpikesSettings",
    "spike_policy": "normlab.launch.config.instruments:SpikePolicySettings",
    "fp16_clamp": "normlab.launch.config.instruments:FP16ClampSettings",
    "early_warning": "normlab.launch.config.instruments:EarlyWarningSettings",
}


def resolve(table: dict[str, str], name: str) -> Any:
    """The component registered under `name` (a KeyError for an unknown one: check names first)."""
    module, attr = table[name].split(":")
    return getattr(import_module(module), attr)
