"""The compare table: one row per run, written to the terminal (rich), Markdown and CSV."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from normlab.launch.metric_keys import (
    ACT_GROWTH,
    CLIP_EVENTS,
    FP16_CLAMPS,
    GRAD,
    MAX_LOGIT,
    NONFINITE,
    RESID,
    S_MAX,
    SCALER_SKIPS,
    SKIPPED,
    SPIKE_GRAD,
    SPIKE_LOSS,
    SPIKE_WINDOW,
)
from normlab.launch.report.domains import domain_columns, domain_values
from normlab.launch.report.fp8_columns import FP8_COLUMNS, fp8_columns, fp8_label
from normlab.launch.report.norm_columns import NORM_COLUMNS, norm_columns, norm_label
from normlab.launch.report.provenance import tokenizer_id
from normlab.launch.report.stabilizer_columns import (
    STABILIZER_COLUMNS,
    stabilizer_columns,
    stabilizer_label,
)
from normlab.launch.rundir.runs import Run, finite
from normlab.launch.warning.events import Event, events_from_summary, events_text, run_events
from rich.console import Console
from rich.table import Table

# key, header, format ('' = text); the order of the table
COLUMNS: list[tuple[str, str, str]] = [
    ("run", "run", ""),
    ("recipe", "recipe", ""),
    ("placement", "placement", ""),
    ("dataset", "dataset", ""),
    ("tokenizer", "tokenizer", ""),
    ("optimizer", "optimizer", ""),
    ("engine", "engine", ""),
    ("global_batch", "global batch", "d"),
    ("lr", "lr", "g"),
    ("seed", "seed", "d"),
    ("warmup", "warm-up", "d"),
    ("status", "status", ""),
    ("events", "events", ""),
    ("steps", "steps", "d"),
    ("final_loss", "final loss", ".4f"),
    ("min_loss", "min loss", ".4f"),
    ("eval_loss", "eval loss", ".4f"),
    ("spike_loss", "loss spike %", ".3f"),
    ("spike_grad", "grad spike %", ".3f"),
    ("spike_window", "spike window", "d"),
    ("skipped", "skipped", "d"),
    ("nonfinite", "non-finite", "d"),
    (SCALER_SKIPS, "scaler skips", "d"),
    ("grad_max", "max grad norm", ".3g"),
    ("grad_p99", "p99 grad norm", ".3g"),
    (ACT_GROWTH, "act. growth", ".2f"),
    (MAX_LOGIT, "max logit", ".2f"),
    ("qk_clips", "QK-Clip events", "d"),
    (FP16_CLAMPS, "fp16 clamps", "d"),
    *((key, label, spec) for key, (label, spec, _) in STABILIZER_COLUMNS.items()),
    *((key, label, spec) for key, (label, spec) in NORM_COLUMNS.items()),
    *((key, label, spec) for key, (label, spec) in FP8_COLUMNS.items()),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("mfu", "MFU %", ".1f"),
]
NOTES = (
    "act. growth: RMS of the residual stream at the last block's end over the first block's, at "
    "the last logged step (for post-norm blocks the sum before their closing norm, whose output "
    "is ~1 by construction). "
    "Spike %: OLMo 2 spike score (SCIENCE.md 8) of the cross-entropy and the gradient norm over "
    "every step so far, with the window in 'spike window' (1000, or steps // 2 for a run shorter "
    "than twice that). Non-finite: steps with a non-finite loss (or gradient norm outside fp16); "
    "scaler skips: fp16 updates the loss scaler skipped. Grad-norm max/p99: over logged steps. "
    "QK-Clip events: heads clipped, summed over steps (optim.qk_clip). "
    "MFU %: model FLOPs (6 N_mm + 12 L H d_h T per token) per second over the device's dense "
    "peak; '-' on a CPU or GPU without a known or given peak (logging.peak_tflops). "
    "Gate mean, 1st-token share, sink mass, cap shares, massive act.: the attention_stabilizers "
    "instrument at the last logged step (SCIENCE.md 12-14; block mean, massive act. block max). "
    "Mean |λ|, DyT/Derf α, saturation (share |f| >= 0.9): the norm_stabilizers instrument at the "
    "last logged step (SCIENCE.md 15-16; mean over sub-layers and the final layer). "
    "Events (SCIENCE.md 23.1): E1 non-finite, E2 smoothed loss 0.5 nats above its running "
    "minimum for 100 steps, E3 back above the initial loss - 0.1 after warm-up; @ first step. "
    "FP8 underflow / >448 / input amax, kurtosis: the fp8 instrument at the last logged step "
    "(SCIENCE.md 24; the largest over converted layers or blocks; >448: share beyond e4m3's "
    "range at unit scale). "
    "'-': not measured (instrument off or no full window yet)."
)


def columns_for(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """COLUMNS with one `eval <name>` column per validation domain after the eval loss."""
    at = next(i for i, (key, _, _) in enumerate(COLUMNS) if key == "eval_loss") + 1
    return COLUMNS[:at] + domain_columns(rows) + COLUMNS[at:]


def placement_label(config: dict[str, Any]) -> str:
    m = config.get("model", {}) or {}
    label = str(m.get("placement", "?"))
    if m.get("ln_scaling") or label == "ln_scaling":  # labelled as before it had its own name
        label = "pre+ln_scaling"
    if m.get("qk_norm") not in (None, "none"):
        label += f"+qk_norm:{m['qk_norm']}"
    if m.get("embed_norm"):
        label += "+embed_norm"
    if m.get("parametrization") not in (None, "sp"):  # µP / CompleteP (SCIENCE.md 21)
        label += f"+{m['parametrization']}"
    return label + stabilizer_label(m) + norm_label(m) + fp8_label(config)


def dataset_label(config: dict[str, Any]) -> str:
    """The run's data: 'bundled' (the shipped corpus), the prepared directory's name, or the
    mixture's source names."""
    data = config.get("data") or {}
    if data.get("sources"):
        return "+".join(str(s.get("name", "?")) for s in data["sources"])
    name = str(data.get("dataset", "?"))
    return name if name == "bundled" else Path(name).name or name


def optimizer_label(config: dict[str, Any]) -> str:
    o = config.get("optim") or {}
    return str(o.get("name", "adamw")) + ("+qk_clip" if o.get("qk_clip") else "")


def engine_label(config: dict[str, Any]) -> str:
    e = config.get("engine") or {}
    name = str(e.get("name", "single"))
    if name == "deepspeed":
        return f"deepspeed zero-{e.get('zero_stage')}"
    return name + (f" x{e['replicate']} replicas" if (e.get("replicate") or 1) > 1 else "")


def ranks_note(history: Any) -> str:
    """', ranks 2 -> 1 at step 4' when the run was resumed on another number of ranks (summary
    .json's [[first step, ranks], ...]); '' otherwise, and for runs that recorded none."""
    try:
        stretches = [(int(step), int(ranks)) for step, ranks in history or []]
    except (TypeError, ValueError):  # a damaged summary: no note rather than a wrong one
        return ""
    if len(stretches) < 2:
        return ""
    changes = ", ".join(f"{r} at step {s}" for s, r in stretches[1:])
    return f", ranks {stretches[0][1]} -> {changes}"


def global_batch(config: dict[str, Any], summary: dict[str, Any]) -> int | None:
    """Sequences per optimizer step over every process (micro-batch x accumulation x world), from
    the tokens per step the run recorded; None for a run that recorded none (older runs)."""
    seq_len = (config.get("data") or {}).get("seq_len")
    tokens = summary.get("tokens_per_step")
    if not isinstance(tokens, int) or not isinstance(seq_len, int) or seq_len <= 0:
        return None
    return tokens // seq_len


def events_of(run: Run) -> list[Event]:
    """The run's events: summary.json's record once the run has ended, else (a run in progress,
    or one from before events were recorded) found again in its metrics."""
    recorded = events_from_summary(run.summary)
    if recorded is not None and run.summary.get("status") != "running":
        return recorded
    return run_events(run.train, run.config)


def _last(run: Run, key: str) -> float | None:
    for row in reversed(run.train):
        if key in row:
            return row[key]
    return None


def summarize(run: Run) -> dict[str, Any]:
    """The table row of one run (None where a value was not measured)."""
    s, cfg = run.summary, run.config
    losses = [r["loss"] for r in run.train]
    grads = finite([r.get(GRAD) for r in run.train])
    steps = max([int(r["step"]) for r in run.train] + [int(s.get("steps") or 0)])
    resid_row = next((r for r in reversed(run.train) if run.blocks(RESID, r)), None)
    growth = None
    if resid_row is not None:
        rms = run.stream_rms(resid_row)  # before the closing norm of post-norm blocks
        growth = rms[-1] / rms[0] if rms[0] else math.inf
    # the attention_logits instrument's max, or QK-Clip's (the same exact per-step S_max)
    logits = finite([r[k] for r in run.train for k in (MAX_LOGIT, S_MAX) if k in r])
    fp16 = (cfg.get("precision") or {}).get("dtype") == "fp16"  # a scaler skip is no failure
    bad_rows = sum(
        not (math.isfinite(r["loss"]) and (fp16 or math.isfinite(r.get(GRAD, 0.0))))
        for r in run.train
    )
    tps = s.get("tokens_per_s") or (
        float(np.mean(finite([r.get("tokens_per_s") for r in run.train]) or [math.nan]))
    )
    events = events_of(run)
    return {
        "run": run.label,
        "recipe": cfg.get("name") or run.label,
        "placement": placement_label(cfg),
        "dataset": dataset_label(cfg),
        "tokenizer": tokenizer_id(cfg),
        "optimizer": optimizer_label(cfg),
        "engine": engine_label(cfg) + ranks_note(s.get("ranks")),
        "global_batch": global_batch(cfg, s),
        "lr": (cfg.get("optim") or {}).get("lr"),
        "seed": (cfg.get("training") or {}).get("seed"),
        "warmup": (cfg.get("schedule") or {}).get("warmup_steps"),
        "status": s.get("status") or "no summary",
        "events": events_text(events),
        "event_kinds": sorted({e.kind for e in events}),  # the study report counts them
        "steps": steps,
        "final_loss": losses[-1] if losses else None,
        "min_loss": s.get("min_loss") if s.get("min_loss") is not None else _min(losses),
        "eval_loss": run.evals[-1]["eval_loss"] if run.evals else None,
        "spike_loss": _measured(_last(run, SPIKE_LOSS)),
        "spike_grad": _measured(_last(run, SPIKE_GRAD)),
        "skipped": _last(run, SKIPPED) or 0,
        "spike_window": _last(run, SPIKE_WINDOW),
        "nonfinite": max(int(_last(run, NONFINITE) or 0), bad_rows),
        SCALER_SKIPS: _last(run, SCALER_SKIPS),
        "grad_max": max(grads) if grads else None,
        "grad_p99": float(np.percentile(grads, 99)) if grads else None,
        ACT_GROWTH: growth,
        MAX_LOGIT: max(logits) if logits else None,
        "qk_clips": _last(run, CLIP_EVENTS),
        FP16_CLAMPS: _last(run, FP16_CLAMPS),
        **stabilizer_columns(run),
        **norm_columns(run),
        **fp8_columns(run),
        "tokens_per_s": tps if tps is not None and math.isfinite(tps) else None,
        "mfu": _mfu_percent(s, run.train),
        **domain_values(run),
    }


def _mfu_percent(summary: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """The run's MFU in percent: summary.json's (over all training time), else the mean of the
    logged steps'; None where no peak was known (launch/training/mfu.py)."""
    mfu = summary.get("mfu")
    if mfu is None:
        logged = finite([r.get("mfu") for r in rows])
        mfu = float(np.mean(logged)) if logged else None
    return 100 * mfu if mfu is not None else None


def _measured(score: float | None) -> float | None:
    """A spike score; None where no point was scored (older runs logged NaN for that)."""
    return None if score is None or math.isnan(score) else score


def _min(values: list[float]) -> float | None:
    ok = finite(values)
    return min(ok) if ok else None


def fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if spec == "d":
        return f"{int(value):d}"
    return format(value, spec) if spec else str(value)


def text_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[fmt(r.get(key), spec) for key, _, spec in columns_for(rows)] for r in rows]


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    """One row per run when the console is wide enough, else one row per metric."""
    cells, columns = text_rows(rows), columns_for(rows)
    wide = sum(max(len(h), *(len(c[j]) for c in cells)) + 3 for j, (_, h, _) in enumerate(columns))
    table = Table(title="normlab compare", caption=NOTES, caption_justify="left")
    if wide <= console.width:
        for _, header, spec in columns:
            table.add_column(header, justify="left" if not spec else "right", no_wrap=True)
        for row in cells:
            table.add_row(*row)
    else:
        table.add_column("metric", no_wrap=True)
        for r in rows:
            table.add_column(r["run"], justify="right")
        for j, (_, header, _) in enumerate(columns[1:], start=1):
            table.add_row(header, *(c[j] for c in cells))
    console.print(table)


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = columns_for(rows)
    head = [h for _, h, _ in columns]
    align = ["---" if not spec else "---:" for _, _, spec in columns]
    lines = ["| " + " | ".join(cells) + " |" for cells in [head, align, *text_rows(rows)]]
    return "\n".join(lines) + "\n\n" + NOTES + "\n"


def depth_markdown(runs: list[Run]) -> str:
    """Residual-stream RMS per block at each run's last logged step (empty without the data)."""
    found = []
    for run in runs:
        row = next((r for r in reversed(run.train) if run.blocks(RESID, r)), None)
        if row is not None:
            found.append((run.label, int(row["step"]), run.blocks(RESID, row)))
    if not found:
        return ""
    depth = max(len(rms) for _, _, rms in found)
    head = ["run", "step", *(f"block {i + 1}" for i in range(depth))]
    lines = ["| " + " | ".join(head) + " |", "|---|---:" + "|---:" * depth + "|"]
    for label, step, rms in found:
        cells = [label, str(step), *(f"{v:.3g}" for v in rms), *([""] * (depth - len(rms)))]
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "Residual-stream RMS (output of each block) at the last logged step:\n\n"
        + "\n".join(lines)
        + "\n"
    )


def csv_text(rows: list[dict[str, Any]]) -> str:
    """Raw values (full precision; empty where not measured)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    columns = columns_for(rows)
    writer.writerow([key for key, _, _ in columns])
    for r in rows:
        writer.writerow(["" if r.get(key) is None else r[key] for key, _, _ in columns])
    return buf.getvalue()
