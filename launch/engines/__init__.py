"""Training engines: single process, FSDP2 and DeepSpeed ZeRO, behind the Engine seam.

Engines are looked up by name in launch.registry.ENGINES; DeepSpeed is imported only when used.
`Engine` loads on first use (PEP 562): `memory` and `memory_plan` (what `normlab plan` reads)
import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normlab.launch.engines.base import Engine

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name != "Engine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from normlab.launch.engines.base import Engine

    return Engine
