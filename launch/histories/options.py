"""The options a command reads histories with (--source, --metric, --fp16): kept apart from the
readers so that registering a command imports neither torch nor tensorboard."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from normlab.launch.errors import ConfigError
from normlab.launch.histories.sources import AUTO, SOURCES, parse_overrides


@dataclass(frozen=True)
class HistoryOptions:
    source: str = AUTO
    metrics: dict[str, str] = field(default_factory=dict)  # --metric NAME=COLUMN
    fp16: bool = False
    steps: int | None = None  # --steps: the runs' planned length (None: their last logged step)


def add_history_options(p: argparse.ArgumentParser) -> None:
    """--source, --metric and --fp16: how a command reads histories from other trainers."""
    p.add_argument(
        "--source",
        default=AUTO,
        choices=(AUTO, *SOURCES),
        help="for TensorBoard/JSONL/CSV histories: whose metric names to read (default auto: "
        "the first source whose loss name is logged; docs/guides/external_runs.md)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="NAME=COLUMN",
        help="read normlab metric NAME (loss, grad_norm, lr, eval_loss, init_loss, step, or any "
        "key) from COLUMN of a history; repeatable",
    )
    p.add_argument(
        "--fp16",
        action="store_true",
        help="the histories trained in fp16 with a loss scaler (an infinite grad norm is a "
        "skipped step, not a failure)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="the histories' planned length in steps (default: each one's last logged step): "
        "a run that reached it completed, and the warnings' horizon is a share of it",
    )


def history_options(args: argparse.Namespace) -> HistoryOptions:
    if args.steps is not None and args.steps <= 0:
        raise ConfigError(f"--steps must be a positive number of steps, got {args.steps}")
    return HistoryOptions(args.source, parse_overrides(args.metric), args.fp16, args.steps)
