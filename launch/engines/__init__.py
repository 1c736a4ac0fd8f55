"""Training engines: single process, FSDP2 and DeepSpeed ZeRO, behind the Engine seam.

Engines are looked up by name in launch.registry.ENGINES; DeepSpeed is imported only when used.
"""

from normlab.launch.engines.base import Engine

__all__ = ["Engine"]
