"""Which reader a path needs, and a History as the Run that compare and warnings read.

A path is read as:
- a normlab run (a directory with config.yaml): launch/rundir's reader, through `normlab_history`;
- a TensorBoard directory (event files directly in it, or in exactly one folder below it, as
  torchtitan's `tb/<timestamp>/` is);
- a `.jsonl` or `.csv` file.
A directory that is none of these is searched for histories below it (a study of runs, or
DIR/<recipe>/lr<lr>/seed<seed>/) by `find_histories`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from normlab.launch.errors import ConfigError
from normlab.launch.histories.history import History, Series, SeriesBuilder, build, lr_of
from normlab.launch.histories.options import HistoryOptions
from normlab.launch.histories.sources import EVAL
from normlab.launch.histories.tabular import read_csv, read_jsonl
from normlab.launch.histories.tensorboard import event_files, read_tensorboard
from normlab.launch.metric_keys import NONFINITE, SPIKE_GRAD, SPIKE_LOSS, SPIKE_WINDOW
from normlab.launch.rundir.runfiles import read_metrics
from normlab.launch.rundir.runs import Run, load_run

SUFFIXES = (".jsonl", ".csv")


def is_normlab_run(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def tensorboard_dir(path: Path) -> Path | None:
    """`path` if event files lie in it, else the one folder below it that holds some."""
    if event_files(path):
        return path
    below = sorted({f.parent for f in path.rglob("*tfevents*") if f.is_file()})
    return below[0] if len(below) == 1 else None


def normlab_history(path: Path, options: HistoryOptions) -> History:
    """A normlab run as a History: its metrics.jsonl rows (launch/rundir's checked reader) under
    the plain names, with the warm-up, precision, length and seed its config records."""
    run = load_run(path)  # its config and summary, each file checked
    columns = SeriesBuilder(path / "metrics.jsonl")
    init = None
    for number, row in enumerate(read_metrics(path / "metrics.jsonl"), start=1):
        step = int(row["step"])
        columns.step(step, f"row {number}")
        for key, value in row.items():
            value = float(value) if isinstance(value, str) else value  # 'nan', 'inf'
            if key == "init_loss":
                init = value
            elif key != "step" and isinstance(value, int | float):
                columns.add(key, step, float(value), f"row {number}")
    history = build(path, "normlab", columns.result(), "plain", options.metrics)
    cfg = run.config
    total = (cfg.get("training") or {}).get("steps")
    return replace(
        history,
        source="normlab",
        warmup_steps=int((cfg.get("schedule") or {}).get("warmup_steps") or 0),
        fp16=(cfg.get("precision") or {}).get("dtype") == "fp16",
        total_steps=int(total) if total else None,
        seed=(cfg.get("training") or {}).get("seed"),
        init_loss=float(init) if init is not None else history.init_loss,
    )


def read_history(path: str | Path, options: HistoryOptions | None = None) -> History:
    """The History at `path` (a run, an event-file directory, a .jsonl or .csv file)."""
    options = options or HistoryOptions()
    p = Path(path)
    step = options.metrics.get("step")
    metrics = {k: v for k, v in options.metrics.items() if k != "step"}
    if p.is_file() and p.suffix in SUFFIXES:
        columns = read_jsonl(p, step) if p.suffix == ".jsonl" else read_csv(p, step)
        history = build(p, p.suffix[1:], columns, options.source, metrics, options.fp16)
        return replace(history, total_steps=options.steps)
    if not p.is_dir():
        raise ConfigError(
            f"{p}: not a run directory, a TensorBoard directory or a .jsonl/.csv history"
        )
    if is_normlab_run(p):
        return normlab_history(p, replace(options, metrics=metrics))
    tb = tensorboard_dir(p)
    folders = sorted({f.parent for f in p.rglob("*tfevents*") if f.is_file()})
    if tb is None and folders:
        shown = ", ".join(str(f.relative_to(p)) for f in folders[:3])
        shown += ", ..." if len(folders) > 3 else ""
        raise ConfigError(
            f"{p}: {len(folders)} folders of event files below it ({shown}): give one of them"
        )
    if tb is None:
        raise ConfigError(
            f"{p}: holds no normlab run (config.yaml), no TensorBoard event files and is not a "
            ".jsonl/.csv history"
        )
    history = build(p, "tensorboard", read_tensorboard(tb), options.source, metrics, options.fp16)
    return replace(history, total_steps=options.steps)


def find_histories(paths: Sequence[str | Path]) -> list[Path]:
    """Each path that is a history itself, else every history below it: the normlab runs when
    there are some, else the folders of event files and the .jsonl/.csv files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() or is_normlab_run(p) or (p.is_dir() and event_files(p)):
            out.append(p)
            continue
        if not p.is_dir():
            raise ConfigError(f"{p}: no such file or directory")
        runs = sorted(c.parent for c in p.rglob("config.yaml") if "checkpoints" not in c.parts)
        if runs:  # a study of normlab runs: its runs (its tables are not histories)
            out += runs
            continue
        tbs = sorted({f.parent for f in p.rglob("*tfevents*") if f.is_file()})
        files = sorted(f for s in SUFFIXES for f in p.rglob(f"*{s}") if f.is_file())
        if not tbs and not files:
            raise ConfigError(f"{p}: no normlab run, TensorBoard directory or history below it")
        out += tbs + files
    return out


def as_run(history: History) -> Run:
    """The Run (launch/rundir/runs.py) that compare's table and card and the warnings read: the
    history's rows, its spike scores in the last row and its events in the summary."""
    # deferred: the spike score lives with its instrument (torch), which a compare of normlab
    # runs alone does not load (tests/launch/test_cli_startup.py)
    from normlab.launch.histories.scores import history_events, spike_scores, train_rows

    rows = [{k: v for k, v in r.items() if k != EVAL} for r in train_rows(history)]
    scores = spike_scores(history)
    events = history_events(history)
    last = rows[-1]
    last.update(
        {SPIKE_WINDOW: float(scores["spike_window"]), NONFINITE: float(scores["nonfinite"])}
    )
    for key, name in ((SPIKE_LOSS, "spike_loss"), (SPIKE_GRAD, "spike_grad")):
        if scores[name] is not None:
            last[key] = scores[name]
    evals = history.get(EVAL) or Series((), ())
    failed = any(e.kind in ("nonfinite", "divergence") for e in events)
    last_step = int(history.loss.steps[-1])
    unknown = "-"  # what a history does not record: shown as not known, not as a default
    config: dict[str, Any] = {
        "name": history.label,
        "model": {"placement": unknown},
        "data": {"dataset": unknown, "tokenizer": unknown, "vocab_size": unknown},
        "optim": {"name": unknown, "lr": lr_of(history.path)},
        "engine": {"name": f"{history.source} ({history.kind})"},
        # its length: the configured one where known, else the last logged step (the horizon
        # of `normlab warnings` is a share of it)
        "training": {"seed": history.seed, "steps": history.total_steps or last_step},
        "schedule": {"warmup_steps": history.warmup_steps},
        "precision": {"dtype": "fp16" if history.fp16 else None},
        "source": {"kind": history.kind, "mapping": history.source, "columns": history.names},
    }
    summary = {
        "status": "diverged" if failed else "completed",
        "steps": last_step,
        "events": [e.to_dict() for e in events],
    }
    return Run(
        path=history.path,
        config=config,
        summary=summary,
        train=rows,
        evals=[{"step": s, EVAL: v} for s, v in zip(evals.steps, evals.values, strict=True)],
    )


def load_runs(paths: Sequence[str | Path], options: HistoryOptions) -> list[Run | Path]:
    """For compare and warnings: a normlab run as its path (read by load_run as before, with
    everything its instruments logged), any other history as a Run built from it."""
    out: list[Run | Path] = []
    for p in find_histories(paths):
        out.append(p if is_normlab_run(p) else as_run(read_history(p, options)))
    return out


def compare_inputs(paths: Sequence[str | Path], options: HistoryOptions) -> list[Run | Path]:
    """For compare: each path as given, a history from another trainer (a .jsonl/.csv file, a
    folder of event files) read into a Run; a normlab run, or what is neither, stays a path
    for launch/rundir's reader (which names what is wrong with it)."""
    out: list[Run | Path] = []
    for p in map(Path, paths):
        external = (p.is_file() and p.suffix in SUFFIXES) or (
            p.is_dir() and not is_normlab_run(p) and tensorboard_dir(p) is not None
        )
        out.append(as_run(read_history(p, options)) if external else p)
    return out
