"""Training engines by name; the trainer builds `ENGINES[cfg.engine.name](cfg)`."""

from __future__ import annotations

from launch.engines.base import Engine
from launch.engines.deepspeed_engine import DeepSpeedEngine
from launch.engines.fsdp import FSDPEngine
from launch.engines.single import SingleEngine

ENGINES: dict[str, type[Engine]] = {
    "single": SingleEngine,
    "fsdp": FSDPEngine,
    "deepspeed": DeepSpeedEngine,  # imports deepspeed only in setup()
}

__all__ = ["ENGINES", "Engine", "SingleEngine"]
