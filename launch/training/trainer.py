"""The training loop: engine-agnostic, resumable bit-for-bit, stops on a non-finite loss.

Per step: set lr, accumulate grad_accum micro-batches, callbacks see the gradients, clip and step
(a callback may veto), callbacks add metrics. Losses stay device tensors and reach the host once
per boundary (log, eval or checkpoint step), where non-finite values are caught before any save.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from normlab.launch.callbacks import Callback, StopRun, build_callbacks, overrides_skip
from normlab.launch.config import RunConfig
from normlab.launch.engines.base import Engine
from normlab.launch.instruments.qk_clip import optim_callbacks
from normlab.launch.metric_keys import GRAD, Z_LOSS
from normlab.launch.optim import set_lr
from normlab.launch.rundir.directory import (
    RunDirLock,
    check_run_dir,
    read_summary,
    write_config,
    write_summary,
)
from normlab.launch.rundir.metrics import MetricsWriter
from normlab.launch.rundir.signals import (
    GracefulStop,
    resume_command,
    stop_message,
    stop_status,
)
from normlab.launch.training.build_run import build_parts, extra_state, rank_world, restore
from normlab.launch.training.evaluation import evaluate, measure_eval, small_val_warnings
from normlab.launch.training.host_rows import boundaries, host_rows, is_finite, log_row
from normlab.launch.training.mfu import run_throughput
from normlab.launch.training.outcome import divergence_message, fresh_stats, run_summary
from normlab.launch.training.preflight import preflight
from normlab.launch.training.progress import ProgressDisplay
from rich.console import Console


class Trainer:
    """`Trainer(cfg).run()` trains (or resumes) the run in cfg.run_dir; returns an exit status."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        force: bool = False,
        from_step: str | None = None,
        allow_unverified: bool = False,
        resume_on_changed_data: bool = False,
        callbacks: list[Callback] | None = None,
        console: Console | None = None,
    ) -> None:
        self.cfg = cfg
        self.force = force
        self.from_step = from_step  # resume from this checkpoint instead of `latest`
        self.allow_unverified = allow_unverified  # a checkpoint without manifest.json loads
        # resume a checkpoint whose data sources changed (tokenizer, shards, sequence count)
        self.resume_on_changed_data = resume_on_changed_data
        self.run_dir = Path(cfg.run_dir or "runs/run")
        self.console = console or Console(soft_wrap=True)  # a log line stays one line (grep)
        self.callbacks = sorted(  # stable; a callback reading the others' metrics runs last
            build_callbacks(cfg.instruments) + optim_callbacks(cfg.optim) + list(callbacks or []),
            key=lambda cb: getattr(cb, "reads_metrics", False),
        )
        self.step = 0
        self.stats: dict[str, Any] = fresh_stats()
        self.engine: Engine
        self.summary: dict[str, Any] = {}
        self.stopped_by = 0  # the signal the run stopped for (with a checkpoint)

    # --- setup ------------------------------------------------------------------------------
    def _build(self) -> None:
        parts = build_parts(self.cfg, self.run_dir)
        self.parts = parts
        parts.ckpt.allow_unverified = self.allow_unverified
        self.engine, self.ckpt, self.lr_at = parts.engine, parts.ckpt, parts.lr_at
        self.loader = parts.loader
        self.tokens_per_step = parts.tokens_per_step
        cfg = self.cfg
        self.throughput, peak_note = run_throughput(
            cfg.model_config(), cfg.data.seq_len, self.engine.world_size, self.engine.device,
            cfg.precision.dtype, cfg.logging.peak_tflops,
        )  # fmt: skip
        if self.engine.is_main:
            self.console.print(peak_note, highlight=False)
            for line in small_val_warnings(self.loader, cfg.training.eval_batches):
                self.console.print(line, style="yellow", highlight=False)

    def _restore(self) -> Path | None:
        restored = restore(
            self.cfg, self.parts, self.callbacks, self.from_step, self.force,
            self.resume_on_changed_data,
        )  # fmt: skip
        if restored is None:
            self.stats["ranks"] = [[0, self.engine.world_size]]  # compare shows later changes
            return None
        for notice in restored.notices if self.engine.is_main else []:
            self.console.print(notice, highlight=False)
        self.step, self.stats = restored.step, restored.stats
        return restored.path

    # --- entry point --------------------------------------------------------------------------
    def run(self) -> int:
        """Train; a multi-process engine then leaves its process group cleanly (every rank).
        Rank 0 owns the run directory (RunDirLock) for the whole run; a second trainer is refused
        before it reads or writes anything there."""
        preflight(self.cfg, rank_world()[1])  # what would fail later, before anything
        owner = rank_world()[0] == 0
        lock = RunDirLock(self.run_dir, "normlab train") if owner else contextlib.nullcontext()
        with lock, GracefulStop() as self.stop:  # USR1/TERM/INT: checkpoint, stop
            status = self._run()
        if hasattr(self, "engine"):
            self.engine.shutdown()  # barrier + destroy; an exception skips it (no barrier hang)
        return status

    def _run(self) -> int:
        diff = check_run_dir(self.run_dir, self.cfg, self.force)  # read-only
        self._build()
        resumed = self._restore()  # raises CheckpointError before anything is written
        main = self.engine.is_main
        if resumed is not None and self.step >= self.cfg.training.steps:
            return self._already_trained(resumed)
        if main:
            write_config(self.run_dir, self.cfg, replaced=bool(diff))
            self.ckpt.remove_stale()
        self.metrics = (
            # drops lines past the resumed step; W&B continues the run id kept in the run dir
            MetricsWriter(
                self.run_dir, self.cfg.logging, self.step, self.cfg.to_dict(), self.cfg.name
            )
            if main
            else None
        )
        self.display = ProgressDisplay(
            self.cfg.name or "run",
            self.cfg.training.steps,
            self.step,
            self.cfg.logging.progress and main,
            self.console,
        )
        if resumed is not None and main:
            self.console.print(f"resuming {self.run_dir} from {resumed.name}", highlight=False)
        self._write_summary("running")
        for cb in self.callbacks:
            cb.on_train_start(self)
        try:
            status = self._loop()
        except BaseException as exc:  # a full disk, a lost peer: the summary never stays "running"
            self._write_summary("failed", message=str(exc) or type(exc).__name__)
            raise
        finally:
            self.display.close()
            if self.metrics is not None:  # W&B marks a run that did not complete as failed
                self.metrics.close(0 if self.summary.get("status") == "completed" else 1)
        for cb in self.callbacks:
            cb.on_train_end(self, status)
        return 0 if status == "completed" else (128 + self.stopped_by if self.stopped_by else 1)

    def _already_trained(self, resumed: Path) -> int:
        """The final checkpoint exists. A run killed after it (summary not 'completed') is
        completed now: summary from the checkpoint's statistics, keep_last applied."""
        self.summary = read_summary(self.run_dir) or {}
        if self.summary.get("status") == "completed":
            if self.engine.is_main:
                self.console.print(f"{self.run_dir}: already trained to step {self.step}")
            return 0
        if self.engine.is_main:
            self.ckpt.prune(keep=resumed.name)
            self.console.print(
                f"{self.run_dir}: stopped after its final checkpoint ({resumed.name}); marked "
                "completed",
                highlight=False,
            )
        self._write_summary("completed")
        return 0

    # --- the loop -----------------------------------------------------------------------------
    def _loop(self) -> str:
        t = self.cfg.training
        pending: list[dict[str, Any]] = []
        window: list[dict[str, float]] = []
        mark = time.perf_counter()
        for step in range(self.step + 1, t.steps + 1):
            try:
                pending.append(self._train_step(step))
            except StopRun as why:  # the spike policy: these bad steps are not a passing spike
                window += self._host_rows(pending, mark)  # steps before the stop stay on record
                if window:
                    self._log(window)
                return self._stopped_by_callback(str(why), step)
            stop = self.stop.agreed() if step < t.steps else 0  # same answer on every rank
            is_log, is_eval, is_ckpt = boundaries(
                t, self.cfg.checkpoint.every, step, bool(stop), self.parts.stable_end
            )
            is_ckpt = is_ckpt or any(cb.wants_checkpoint() for cb in self.callbacks)
            if not (is_log or is_eval or is_ckpt):
                continue
            rows = self._host_rows(pending, mark)
            pending = []
            fp16 = self.cfg.precision.dtype == "fp16"
            bad = next((r for r in rows if not is_finite(r, fp16)), None)
            window += rows if bad is None else rows[: rows.index(bad) + 1]
            if is_log or bad is not None:
                self._log(window)
                window = []
            if bad is not None:
                return self._diverged(bad)
            self.step = step
            if is_eval:
                self._evaluate(step)
            if is_ckpt:
                self.ckpt.save(
                    self.engine,
                    step,
                    extra_state(self.cfg, step, self.loader, self.stats, self.callbacks),
                )
            else:
                self.ckpt.poll(self.engine)  # commits an asynchronous save once written
            if stop:
                return self._stopped(stop)
            mark = time.perf_counter()
        self.ckpt.wait(self.engine)
        self._write_summary("completed")
        return "completed"

    def _train_step(self, step: int) -> dict[str, Any]:
        engine = self.engine
        lr = set_lr(engine.optimizer, self.lr_at(step))  # optim.lr x the schedule, per group
        engine.zero_grad()
        total = None
        for _ in range(self.cfg.training.grad_accum):
            inputs, targets = next(self.loader)
            loss = engine.forward_backward(inputs, targets)
            total = loss if total is None else total + loss
        parts = engine.pop_loss_parts(total / self.cfg.training.grad_accum)
        for cb in self.callbacks:
            cb.on_after_backward(self, step)
        veto = partial(self._veto, step, parts["ce"]) if overrides_skip(self.callbacks) else None
        grad_norm, skipped = engine.clip_and_step(self.cfg.optim.grad_clip, veto)
        # `loss` is the cross-entropy; the z-loss term, when on, is logged beside it
        metrics: dict[str, Any] = {"step": step, "loss": parts["ce"], GRAD: grad_norm}
        metrics.update({Z_LOSS: parts["z"]} if "z" in parts else {})
        metrics["lr"] = lr
        if veto is not None:
            metrics["skipped"] = float(skipped)
        for cb in self.callbacks:
            cb.on_step_end(self, step, metrics)
        return metrics

    def _veto(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        return any(cb.should_skip_step(self, step, loss, grad_norm) for cb in self.callbacks)

    def _host_rows(self, pending: list[dict[str, Any]], mark: float) -> list[dict[str, float]]:
        return host_rows(pending, mark, self.stats, self.tokens_per_step)

    # --- outputs ------------------------------------------------------------------------------
    def _log(self, window: list[dict[str, float]]) -> None:
        step = int(window[-1]["step"])
        row = log_row(window, self.tokens_per_step)
        row.update(self.throughput.row(row["tokens_per_s"]))  # per GPU, TFLOP/s, MFU
        if math.isfinite(row["loss"]):
            self.stats["min_loss"] = min(self.stats["min_loss"], min(r["loss"] for r in window))
        self.stats["loss"] = row["loss"]
        if len(self.loader.names) > 1:  # drawn so far, over all ranks
            row |= {f"tokens/{k}": float(v) for k, v in self.loader.tokens_seen().items()}
        if self.metrics is not None:
            self.metrics.log(step, row)
        for cb in self.callbacks:
            cb.on_log(self, step, row)
        self.display.update(step, row["loss"], row["tokens_per_s"])

    def skip_batches(self, steps: int) -> None:
        for _ in range(steps * self.cfg.training.grad_accum):
            next(self.loader)

    def measure_eval(self) -> tuple[float, list[float]]:
        """(eval loss, per-source losses), recording nothing (launch/training/evaluation.py)."""
        return measure_eval(self.engine, self.loader, self.cfg.training.eval_batches)

    def _evaluate(self, step: int) -> None:
        evaluate(self, step)

    def _diverged(self, row: dict[str, float]) -> str:
        self.ckpt.wait(self.engine)  # a save in flight is of a good step: let it land
        msg = divergence_message(row, self.ckpt.latest())
        self.console.print(f"[red]{msg}[/red]", highlight=False)
        self._write_summary("diverged", message=msg, diverged_step=int(row["step"]))
        return "diverged"

    def _stopped_by_callback(self, reason: str, step: int) -> str:
        """A callback ended the run at `step` (StopRun); the steps before it are logged."""
        self.ckpt.wait(self.engine)
        self.console.print(f"[red]{reason}[/red]", highlight=False)
        self._write_summary("diverged", message=reason, diverged_step=step)
        return "diverged"

    def _stopped(self, signum: int) -> str:
        """Every rank stopped after this step for `signum`; its checkpoint is written."""
        self.stopped_by = signum
        self.ckpt.wait(self.engine)  # an asynchronous save of this step must land first
        ckpt = self.ckpt.latest()
        resume = resume_command(self.run_dir)
        msg = stop_message(signum, self.step, self.cfg.training.steps, ckpt, resume)
        self._write_summary(stop_status(signum), message=msg, checkpoint=str(ckpt))
        if self.engine.is_main:
            self.display.close()
            print(f"normlab: {msg}", file=sys.stderr, flush=True)
        return stop_status(signum)

    def _write_summary(self, status: str, **extra: Any) -> None:
        self.summary = run_summary(self, status, **extra)
        if self.engine.is_main:
            write_summary(self.run_dir, self.summary)
