"""A results table (launch/verdicts/results_table.py) built from histories, for `normlab
verdicts DIR`: one row per run, its (recipe, lr, seed) named by where it lies.

Layout: DIR/<recipe>/lr<lr>/seed<seed>, the last part a history (a TensorBoard folder, a normlab
run, a folder holding one .jsonl/.csv history) or a file `seed<seed>.jsonl` / `.csv`. Any other
layout is named by a mapping file (`--layout FILE.csv`, read by launch/csv_table.py): columns
path (relative to the file's folder), recipe, lr, seed and optionally size.

Per run: `eval_loss` is the last logged eval loss (`--eval-loss final`) or the median of the last
three (`smoothed` [choice]: events.py's median smoothing, over the evals); `status` is diverged
when the history has event E1 or E2 (launch/histories/scores.py), else completed; `l0` the
history's init_loss, else its first logged loss when logged at step 0 or 1 (the initialised
model's loss), else empty. The table is then written as CSV and read back by the verdicts' own
reader, so it gets the same checks as any table (losses >= 0, lr > 0, a run once, ...).
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path

from normlab.launch import csv_table
from normlab.launch.errors import ConfigError
from normlab.launch.histories.history import History
from normlab.launch.histories.load import read_history
from normlab.launch.histories.options import HistoryOptions
from normlab.launch.histories.scores import history_events
from normlab.launch.histories.sources import EVAL

HEADER = ["recipe", "size", "lr", "seed", "eval_loss", "status", "l0", "path"]
SMOOTHED_EVALS = 3
LR, SEED = re.compile(r"lr[_=-]?(.+)"), re.compile(r"seed[_=-]?(\d+)")


def _layout_rows(root: Path) -> list[dict[str, str]]:
    """(recipe, lr, seed, path) of every DIR/<recipe>/lr<lr>/seed<seed>[.jsonl|.csv]."""
    out = []
    for recipe_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for lr_dir in sorted(p for p in recipe_dir.iterdir() if p.is_dir()):
            lr = LR.fullmatch(lr_dir.name)
            if lr is None:
                raise ConfigError(f"{lr_dir}: expected DIR/<recipe>/lr<lr>/seed<seed>")
            for leaf in sorted(lr_dir.iterdir()):
                seed = SEED.fullmatch(leaf.stem if leaf.is_file() else leaf.name)
                if seed is None:
                    raise ConfigError(f"{leaf}: expected DIR/<recipe>/lr<lr>/seed<seed>")
                out.append(
                    {"recipe": recipe_dir.name, "size": "", "lr": lr.group(1),
                     "seed": seed.group(1), "path": str(leaf)}
                )  # fmt: skip
    if not out:
        raise ConfigError(f"{root}: no runs laid out as DIR/<recipe>/lr<lr>/seed<seed>")
    return out


def _mapped_rows(mapping: Path) -> list[dict[str, str]]:
    table = csv_table.read_table(mapping, "run mapping", ("path", "recipe", "lr", "seed"))
    out = []
    for row in table.rows:
        path = Path(row["path"].strip())
        path = path if path.is_absolute() else mapping.parent / path
        if not path.exists():
            raise ConfigError(f"{table.where(row, 'path')}: {path} does not exist")
        out.append({**{k: row.get(k).strip() for k in HEADER if k != "path"}, "path": str(path)})
    if not out:
        raise ConfigError(f"{mapping}: no runs (a header and no rows)")
    return out


def _leaf(path: Path) -> Path:
    """A folder holding exactly one .jsonl/.csv history (and no event files) is that file."""
    if path.is_dir() and not (path / "config.yaml").is_file() and not any(path.glob("*tfevents*")):
        files = sorted(p for s in ("*.jsonl", "*.csv") for p in path.glob(s))
        if len(files) == 1:
            return files[0]
    return path


def eval_loss(history: History, mode: str) -> float:
    evals = history.get(EVAL)
    if evals is None or not evals.values:
        return math.nan
    if mode == "final":
        return evals.values[-1]
    return float(statistics.median(evals.values[-SMOOTHED_EVALS:]))


def initial_loss(history: History) -> float:
    if history.init_loss is not None:
        return history.init_loss
    return history.loss.values[0] if history.loss.steps[0] <= 1 else math.nan


def results_csv(
    root: Path, mapping: Path | None, options: HistoryOptions, mode: str = "final"
) -> str:
    """The results table's CSV text for the histories under `root` (or named by `mapping`)."""
    if mode not in ("final", "smoothed"):
        raise ConfigError(f"--eval-loss {mode!r}: expected final or smoothed")
    rows = _mapped_rows(mapping) if mapping is not None else _layout_rows(root)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(HEADER)
    for row in rows:
        history = read_history(_leaf(Path(row["path"])), options)
        failed = any(e.kind in ("nonfinite", "divergence") for e in history_events(history))
        loss = eval_loss(history, mode)
        if not failed and math.isnan(loss):
            raise ConfigError(
                f"{row['path']}: no eval loss ({history.source} logs it as "
                f"{history.names.get(EVAL, 'an eval series')}); name it with "
                "--metric eval_loss=COLUMN"
            )
        l0 = initial_loss(history)
        writer.writerow(
            [row["recipe"], row["size"], row["lr"], row["seed"],
             "" if math.isnan(loss) else repr(loss), "diverged" if failed else "completed",
             "" if math.isnan(l0) else repr(l0), row["path"]]
        )  # fmt: skip
    return text.getvalue()


TABLE = "results_from_histories.csv"  # written beside verdicts.md: the table the verdicts read


def verdicts_from_histories(
    root: str | None,
    mapping: str | None,
    options: HistoryOptions,
    mode: str,
    out: str,
    decide: Callable[[Path], list[str]],
) -> list[str]:
    """Build the table, let `decide` (run_verdicts on a table path) read it as any table, then
    keep it as --out/results_from_histories.csv; nothing is written when a step fails."""
    import tempfile

    if root is None and mapping is None:
        raise ConfigError("a results table, a folder of histories or --layout FILE is needed")
    text = results_csv(Path(root or "."), Path(mapping) if mapping else None, options, mode)
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / TABLE
        table.write_text(text)
        lines = decide(table)
    (Path(out) / TABLE).write_text(text)
    return [*lines, f"the table built from the histories: {Path(out) / TABLE}"]
