"""Before `--merge` joins a source's runs: were they trained as the same experiment as DIR's?

Two checks, each refusing in one line that names the run and what differs (nothing is written):

- per grid point (recipe, size, lr): results.csv's `setup` hash (launch/study/setup.py) of each
  source run must be one of DIR's at that point (the usual case: more seeds of the same grid).
  Where both tables lack the column (tables written before it) the check is skipped. The line names
  the differing keys when both runs' config.yaml are at hand (DIR/runs/..., MORE/runs/...).
- per recipe and size, over every learning rate (new rates too): compare.csv's columns that do not
  depend on the learning rate (SETUP_COLUMNS: the placement, data, tokenizer, optimizer, global
  batch, warm-up, and the steps of completed runs) must agree with DIR's, which also covers the
  committed studies whose tables have no setup hash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.launch.errors import ConfigError
from normlab.launch.rundir.directory import CONFIG, shown_diff
from normlab.launch.rundir.runfiles import DamagedFile, read_config
from normlab.launch.study.setup import setup_diff
from normlab.launch.verdicts.results_table import Run

SETUP_COLUMNS = ("placement", "dataset", "tokenizer", "optimizer", "global_batch", "warmup")
Point = tuple[str, str, float]  # recipe, size, lr
SEED = re.compile(r"_s\d+$")
LR = re.compile(r"_lr[0-9.eE+-]+(?=_|$)")


def check_setups(
    base: dict[Any, Run],
    new: list[Run],
    src: Path,
    out: Path,
    name_of: Callable[[Point], str | None],
) -> None:
    """Refuse a run of `new` whose setup hash is not one of DIR's at its grid point. `name_of`:
    a run directory name at that point (any seed), asked only to name the keys of a refusal."""
    known: dict[Point, dict[str, Run]] = {}
    for run in base.values():
        if run.setup:
            known.setdefault((run.recipe, run.size, run.lr), {}).setdefault(run.setup, run)
    for run in new:
        there = known.get((run.recipe, run.size, run.lr))
        if not run.setup or not there or run.setup in there:
            continue
        old = next(iter(there.values()))
        why = _named_difference(name_of((run.recipe, run.size, run.lr)), old, run, out, src)
        raise ConfigError(
            f"--merge {src}: recipe {run.recipe} size {run.size} lr {run.lr:g} seed {run.seed} was "
            f"trained with another setup than seed {old.seed} in {out} ({why}): run it with the "
            "same study file, --steps and --set"
        )


def _named_difference(name: str | None, old: Run, run: Run, out: Path, src: Path) -> str:
    """'training.steps: 200 -> 100' from the two runs' config.yaml, else the two hashes."""
    if name is not None:
        a = _config(out / "runs" / SEED.sub(f"_s{old.seed}", name))
        b = _config(src / "runs" / SEED.sub(f"_s{run.seed}", name))
        differ = setup_diff(a, b) if a is not None and b is not None else []
        if differ:
            return shown_diff(differ, 3)
    return f"setup {old.setup} there, {run.setup} here"


def _config(run_dir: Path) -> dict | None:
    """The run's config.yaml (launch/rundir/runfiles.py), None where it is missing or damaged."""
    if not (run_dir / CONFIG).is_file():
        return None
    try:
        return read_config(run_dir / CONFIG)
    except DamagedFile:
        return None


def check_compare_setups(
    base: dict[str, dict[str, str]], new: dict[str, dict[str, str]], src: Path, out: Path
) -> None:
    """Refuse a source compare.csv row whose lr-independent columns (SETUP_COLUMNS, and steps when
    both runs completed) differ from those of DIR's runs of the same recipe and size (the run name
    without its learning rate and seed). An empty cell (a column added after the run) is skipped."""
    first: dict[str, dict[str, str]] = {}
    done: dict[str, dict[str, str]] = {}
    for name, row in base.items():
        first.setdefault(_cell_of(name), row)
        if row.get("status") == "completed":
            done.setdefault(_cell_of(name), row)
    for name, row in new.items():
        pairs: list[tuple[dict[str, str] | None, tuple[str, ...]]] = [
            (first.get(_cell_of(name)), SETUP_COLUMNS)
        ]
        if row.get("status") == "completed":
            pairs.append((done.get(_cell_of(name)), ("steps",)))
        for old, columns in pairs:
            if old is None:
                continue
            for column in columns:
                was, now = old.get(column) or "", row.get(column) or ""
                if was and now and was != now:
                    raise ConfigError(
                        f"--merge {src}: run {name} has {column} {now!r}, but {out}'s runs of the "
                        f"same recipe and size have {was!r} ({old['run']}): trained as another "
                        "experiment; run it with the same study file, --steps and --set"
                    )


def _cell_of(name: str) -> str:
    """A run name without its learning rate and seed: its recipe and size."""
    return SEED.sub("", LR.sub("", name))
