"""Weights & Biases as a second logger beside TensorBoard (`logging.wandb`), one W&B run per run
directory however often the job is resumed or requeued.

The W&B run id lives in `<run>/wandb.json`, beside the last step W&B was sent. A resumed process
(a SLURM requeue, a `normlab train` after SIGTERM) re-opens that id with `resume="allow"` and
sends only steps above it: the steps replayed between the last checkpoint and the stop were
already logged, with the same values (resume is bit-exact), so W&B keeps one row per step and
its step axis only grows. W&B's files go to `<run>/wandb/` unless WANDB_DIR names another
place. Offline runs are uploaded later with `wandb sync <run>/wandb/offline-run-*` (every
directory of one run id merges into that run).
"""

from __future__ import annotations

import json
import os
import secrets
import string
from pathlib import Path
from typing import Any

from normlab.launch.errors import ConfigError
from normlab.launch.extras import require
from normlab.launch.rundir.wandb_setup import STATE, read_state

FILES = ("config.yaml", "summary.json")  # uploaded as files when the run ends (wandb.save)


def _new_id() -> str:
    """8 characters of [a-z0-9], the form of W&B's own run ids."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)


class WandbLogger:
    """Scalars by step, the resolved config (W&B config and config.yaml as a file) and the
    summary (W&B summary and summary.json as a file) into one W&B run (main rank)."""

    def __init__(
        self, run_dir: Path, section: Any, config: dict[str, Any], name: str | None
    ) -> None:
        require("wandb", "logging.wandb")
        import wandb

        self._run_dir = run_dir
        self._state_path = run_dir / STATE
        state = read_state(self._state_path)  # damage: one line (preflight checked it)
        run_id = state.get("run_id") or _new_id()
        self._floor = int(state.get("last_step", 0))  # W&B already holds steps up to here
        self._last = self._floor
        files = os.environ.get("WANDB_DIR") or run_dir  # W&B adds its own wandb/ below
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                project=section.project,
                entity=section.entity,
                name=name,
                id=run_id,
                resume="allow",
                mode=section.mode,
                tags=list(section.tags),
                dir=str(files),
                config=config,
            )
        except Exception as exc:  # noqa: BLE001 (what preflight cannot foresee: the network...)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"logging.wandb: W&B did not start ({type(exc).__name__}: {first}); use "
                "mode: offline and `wandb sync` later, or mode: disabled"
            ) from None
        _write_state(self._state_path, {"run_id": run_id, "last_step": self._last})

    @property
    def run_id(self) -> str:
        return self._run.id

    def log(self, step: int, scalars: dict[str, float], prefix: str) -> None:
        if step <= self._floor:
            return  # logged before the stop this process resumes from
        self._run.log({f"{prefix}/{k}": v for k, v in scalars.items()}, step=step)
        if step > self._last:
            self._last = step
            _write_state(self._state_path, {"run_id": self._run.id, "last_step": step})

    def summary(self, summary: dict[str, Any]) -> None:
        self._run.summary.update({k: v for k, v in summary.items() if v is not None})

    def close(self, exit_code: int = 0) -> None:
        """Upload the run's config.yaml and summary.json as files, then end the W&B run."""
        for name in FILES:
            path = self._run_dir / name
            if path.is_file():  # offline: linked into the W&B run's files/, sent by `wandb sync`
                self._run.save(str(path), base_path=str(self._run_dir), policy="now")
        self._run.finish(exit_code=exit_code)
