"""Components by recipe name (a leaf: imports nothing of launch).

Each table maps the name a recipe uses to "module:attribute". The config checks names here
without importing any component (so launch.config stays a leaf); the trainer imports a
component only when a run uses it (DeepSpeed, for one, is heavy and optional).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

ENGINES = {
    "single": "launch.engines.single:SingleEngine",
    "fsdp": "launch.engines.fsdp:FSDPEngine",
    "deepspeed": "launch.engines.deepspeed_engine:DeepSpeedEngine",
}

# factory(model, OptimSection) -> torch.optim.Optimizer
OPTIMIZERS = {
    "adamw": "launch.optim:build_adamw",
    "muon": "launch.optim:build_muon",
}

# factory(settings dict) -> Callback; the name is also the key of its state in checkpoints.
INSTRUMENTS = {
    "activations": "launch.instruments.activations:ActivationStats",
    "gradients": "launch.instruments.gradients:GradientStats",
    "attention_logits": "launch.instruments.attention:AttentionLogits",
    "qk_gains": "launch.instruments.attention:QKGains",
    "spike_score": "launch.instruments.spikes:SpikeScore",
    "spike_policy": "launch.instruments.policy:SpikePolicy",
    "fp16_clamp": "launch.instruments.fp16:FP16Clamp",
}


def resolve(table: dict[str, str], name: str) -> Any:
    """The component registered under `name` (a KeyError for an unknown one: check names first)."""
    module, attr = table[name].split(":")
    return getattr(import_module(module), attr)
