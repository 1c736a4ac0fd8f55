"""Everything that can stop Weights & Biases from starting, checked in preflight: before the run
directory is created, each is one line (exit 2) naming what to fix.

- wandb not installed (the `wandb` extra), or installed but failing to import;
- W&B settings from the environment it refuses (`WANDB_MODE=garbage`, any WANDB_* it validates);
- `mode: online` without credentials (WANDB_API_KEY, or a `wandb login` entry in ~/.netrc);
- a damaged `<run>/wandb.json` (the W&B run id a resume continues): not JSON, not a mapping, a
  run id W&B would not accept, or a last step that is not a whole number >= 0.
"""

from __future__ import annotations

import netrc
import os
import re
from pathlib import Path
from typing import Any

from normlab.launch.errors import ConfigError, RunDirError
from normlab.launch.extras import require

STATE = "wandb.json"
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what W&B accepts as a run id
DEFAULT_HOST = "https://api.wandb.ai"


def read_state(path: Path) -> dict[str, Any]:
    """{'run_id': str, 'last_step': int} of `path`, {} when it does not exist; damage is a
    RunDirError naming the file (a resume must not silently start a second W&B run)."""
    if not path.exists():
        return {}
    fix = "delete it to start a new W&B run for this directory"
    from normlab.launch.json_file import read_json

    def damaged(message: str) -> RunDirError:
        return RunDirError(f"{path}: damaged W&B state ({message.replace(str(path), 'it', 1)})")

    state = read_json(path, "W&B state", damaged, fix)
    if not isinstance(state, dict):
        raise RunDirError(
            f"{path}: damaged W&B state (a {type(state).__name__}, not a mapping); {fix}"
        )
    run_id, last = state.get("run_id"), state.get("last_step", 0)
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise RunDirError(f"{path}: damaged W&B state (run_id {run_id!r} is no W&B run id); {fix}")
    if isinstance(last, bool) or not isinstance(last, int) or last < 0:
        raise RunDirError(
            f"{path}: damaged W&B state (last_step {last!r} is not a step number); {fix}"
        )
    return {"run_id": run_id, "last_step": last}


def check_wandb(section: Any, run_dir: Path, credentials: bool = True) -> None:
    """Raise the one-line error that starting W&B for this run would end in (see the module).
    credentials=False (validate, a job submitted to other machines, whose environment may hold
    its own key) leaves out the online-mode credentials."""
    if section is None or section.mode == "disabled":
        return
    require("wandb", "logging.wandb")
    try:
        import wandb
    except Exception as exc:  # noqa: BLE001 (a broken install raises anything)
        raise ConfigError(
            f"logging.wandb: the installed wandb does not import ({type(exc).__name__}: "
            f"{_first_line(exc)}); reinstall it (pip install --force-reinstall "
            "'normlab[wandb]') or remove logging.wandb"
        ) from None
    _check_environment(wandb)
    online = os.environ.get("WANDB_MODE") in (None, "", "online", "run")
    if credentials and section.mode == "online" and online:
        _check_credentials()
    read_state(run_dir / STATE)


def _check_environment(wandb: Any) -> None:
    """W&B validates its WANDB_* variables when a run starts; do it now."""
    settings = getattr(wandb, "Settings", None)
    update = getattr(settings(), "update_from_env_vars", None) if settings else None
    if update is None:  # a wandb without this API: wandb.init reports them itself
        return
    try:
        update(dict(os.environ))
    except Exception as exc:  # noqa: BLE001 (pydantic's ValidationError, ValueError, ...)
        raise ConfigError(f"logging.wandb: {_env_problem(exc)}") from None


def _env_problem(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            field = str(first["loc"][0]) if first.get("loc") else ""
            var = f"WANDB_{field.upper()}" if field else "a WANDB_* variable"
            given = os.environ.get(var, first.get("input"))
            return (
                f"W&B refuses {var}={given!r} ({first['msg']}); fix or unset it in the "
                "environment"
            )
        except (IndexError, KeyError, TypeError):
            pass
    return f"W&B refuses its settings from the environment: {_first_line(exc)}"


def _check_credentials() -> None:
    """Online mode needs an API key: WANDB_API_KEY, or the ~/.netrc entry `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return
    host = os.environ.get("WANDB_BASE_URL", DEFAULT_HOST).split("://")[-1].split("/")[0]
    host = host.split(":")[0]
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host) if path.is_file() else None
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry is None or not entry[2]:
        raise ConfigError(
            "logging.wandb: mode online needs W&B credentials: set WANDB_API_KEY or run "
            f"`wandb login` (no key for {host} in {path}); or use mode: offline and `wandb sync`"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
