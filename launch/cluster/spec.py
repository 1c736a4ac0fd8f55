"""The cluster file (site defaults kept apart from recipes) and the resolved job request.

A cluster YAML holds what every job on one site shares: partition, account, the lines that set up
the environment, an optional container. Command-line options override it. Every value is checked
here, before anything is written or submitted, because each one lands in a shell script.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.launch.config.loader import build, read_strict_yaml
from normlab.launch.errors import ConfigError

# SLURM --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")
MEM = re.compile(r"^\d+[KMGT]?$")
WORD = re.compile(r"^[A-Za-z0-9_.:@+,\[\]-]+$")  # partition, account, qos names
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SIGNAL_GRACE = 65535  # SLURM's limit for --signal=...@time


@dataclass
class Container:
    """A pyxis/enroot container for the srun step (`srun --container-image`)."""

    image: str
    mounts: list[str] = field(default_factory=list)


@dataclass
class ClusterSpec:
    """Every key of a cluster YAML (and of the matching `normlab submit` options)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str | int | None = None  # int: YAML read an unquoted 24:00:00 as a number
    mem: str | int | None = None
    cpus_per_task: int | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    exclusive: bool = False
    signal_grace_s: int = 120
    requeue: bool = True
    python: str | None = None
    setup: list[str] = field(default_factory=list)
    env: dict[str, str | int | float] = field(default_factory=dict)
    container: Container | None = None

    @property
    def procs_per_node(self) -> int:
        """One rank per GPU; one CPU rank per node for a CPU job."""
        return max(1, self.gpus_per_node or 0)


def load_cluster(path: str | Path | None) -> ClusterSpec:
    """The cluster file's settings (defaults when there is none), checked."""
    if path is None:
        return ClusterSpec()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"cluster file {p} does not exist")
    data = read_strict_yaml(p, "cluster file") or {}  # the one YAML reader: no key twice
    if not isinstance(data, dict):
        raise ConfigError(f"cluster file {p}: expected a mapping of cluster settings")
    spec = build(ClusterSpec, data, "cluster.")
    return spec


def with_options(spec: ClusterSpec, options: dict[str, Any]) -> ClusterSpec:
    """Command-line values (None: not given) override the cluster file; then validate."""
    given = {k: v for k, v in options.items() if v is not None}
    merged = dataclasses.replace(spec, **given)
    validate(merged)
    return merged


def validate(spec: ClusterSpec) -> None:
    if spec.gpus_per_node is None:
        raise ConfigError(
            "give --gpus-per-node (0 for a CPU job) or set gpus_per_node in the cluster file"
        )
    for key in ("nodes", "cpus_per_task"):
        value = getattr(spec, key)
        if value is not None and value < 1:
            raise ConfigError(f"cluster.{key} must be >= 1, got {value}")
    if spec.gpus_per_node < 0:
        raise ConfigError(f"cluster.gpus_per_node must be >= 0, got {spec.gpus_per_node}")
    if not 1 <= spec.signal_grace_s <= MAX_SIGNAL_GRACE:
        raise ConfigError(
            f"cluster.signal_grace_s must lie in 1..{MAX_SIGNAL_GRACE}, got {spec.signal_grace_s}"
        )
    for key in ("partition", "account", "qos", "constraint"):
        _word(key, getattr(spec, key))
    if isinstance(spec.time, int):
        raise ConfigError(
            f'cluster.time must be a quoted string such as "24:00:00", got the number '
            f"{spec.time} (YAML reads an unquoted 24:00:00 as 86400)"
        )
    if spec.time is not None and not TIME.match(spec.time):
        raise ConfigError(
            f"cluster.time must be a SLURM time (MM, HH:MM:SS, D-HH:MM:SS ...), got {spec.time!r}"
        )
    if spec.time is not None and time_limit_s(spec.time) <= spec.signal_grace_s:
        raise ConfigError(
            f"cluster.time {spec.time} is not longer than signal_grace_s ({spec.signal_grace_s} "
            "s): the preemption signal would arrive before the job starts training"
        )
    if spec.mem is not None and not MEM.match(str(spec.mem)):
        raise ConfigError(f"cluster.mem must look like 64G, 4000M or 0, got {spec.mem!r}")
    _check_env(spec.env)
    for i, line in enumerate(spec.setup):
        if "\n" in line or "\r" in line:
            raise ConfigError(f"cluster.setup[{i}] must be one line, got {line!r}")
    if spec.container is not None and not spec.container.image.strip():
        raise ConfigError("cluster.container.image must not be empty")


def resource_warning(spec: ClusterSpec) -> str | None:
    """A GPU job that leaves its CPUs or memory to the site's defaults (often one core, shared
    by torchrun and every rank), or None."""
    if not spec.gpus_per_node:
        return None
    defaults = {"cpus_per_task": "CPUs (often one core)", "mem": "memory"}
    missing = [key for key in defaults if getattr(spec, key) is None]
    if not missing:
        return None
    keys = " and ".join(f"{key} (--{key.replace('_', '-')})" for key in missing)
    what = " and ".join(defaults[key] for key in missing)
    return (
        f"warning: a GPU job without {keys}: torchrun and its {spec.procs_per_node} ranks get "
        f"the site's default {what}; set it in the cluster file or on the command line"
        + (" (mem 0: all of a node's memory)" if "mem" in missing else "")
    )


def _word(key: str, value: str | None) -> None:
    if value is not None and not WORD.match(value):
        raise ConfigError(
            f"cluster.{key} {value!r} is not a SLURM name (letters, digits, _ . : @ + , [ ] -)"
        )


def _check_env(env: dict[str, str | int | float]) -> None:
    for name, value in env.items():
        if not ENV_NAME.match(str(name)):
            raise ConfigError(f"cluster.env: {name!r} is not a valid environment variable name")
        if str(name).startswith("SLURM_"):
            raise ConfigError(
                f"cluster.env: {name} is reserved: SLURM sets (and overwrites) SLURM_* variables "
                "itself; choose another name"
            )
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"cluster.env.{name} must be a string, got {value!r}")


def time_limit_s(text: str) -> int:
    """Seconds in a SLURM --time value (already matched by TIME)."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + s
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]
