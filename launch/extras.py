"""Optional dependencies, checked before any process starts: a missing one is one line naming the
pip extra that installs it (pyproject.toml [project.optional-dependencies]). A leaf module."""

from __future__ import annotations

import importlib.util

from normlab.launch.errors import NormlabError

# import name -> (what needs it, the extra that installs it)
EXTRAS = {
    "deepspeed": ("DeepSpeed", "distributed"),
    "transformers": ("HF transformers", "hf"),
    "wandb": ("Weights & Biases (wandb)", "wandb"),
    "torchao": ("torchao (float8 training)", "fp8"),
}


class MissingDependency(NormlabError):
    """An optional package a command needs is not installed."""


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def require(module: str, needed_for: str) -> None:
    """Raise MissingDependency naming the extra when `module` is not importable."""
    if installed(module):
        return
    package, extra = EXTRAS[module]
    raise MissingDependency(
        f"{needed_for} needs {package}, which is not installed: pip install 'normlab[{extra}]' "
        f"(or pip install -e '.[{extra}]' in a clone)"
    )
