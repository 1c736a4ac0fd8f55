"""Training engines by name; the trainer builds `ENGINES[cfg.engine.name](cfg)`."""

from __future__ import annotations

from launch.engines.base import Engine
from launch.engines.single import SingleEngine

ENGINES: dict[str, type[Engine]] = {"single": SingleEngine}

__all__ = ["ENGINES", "Engine", "SingleEngine"]
