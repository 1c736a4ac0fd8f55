"""Stability instruments: callbacks listed by name in launch.registry.INSTRUMENTS.

A recipe switches them on in its `instruments:` section, e.g.
`instruments: {activations: true, spike_score: {window: 1000, k: 7}}`. Metric keys are listed in
`launch.instruments.common`.
"""

from normlab.launch.instruments.activations import ActivationStats
from normlab.launch.instruments.attention import AttentionLogits, QKGains
from normlab.launch.instruments.fp16 import ClampHooks, FP16Clamp, clamp_fp16
from normlab.launch.instruments.gradients import GradientStats
from normlab.launch.instruments.policy import SpikePolicy
from normlab.launch.instruments.spikes import RollingSpikeScore, SpikeScore, spike_score
from normlab.launch.instruments.updates import UpdateSpikes

OBSERVERS = [
    "activations",
    "gradients",
    "attention_logits",
    "qk_gains",
    "spike_score",
    "update_spikes",
]

__all__ = [
    "OBSERVERS",
    "ActivationStats",
    "AttentionLogits",
    "ClampHooks",
    "FP16Clamp",
    "GradientStats",
    "QKGains",
    "RollingSpikeScore",
    "SpikePolicy",
    "SpikeScore",
    "UpdateSpikes",
    "clamp_fp16",
    "spike_score",
]
