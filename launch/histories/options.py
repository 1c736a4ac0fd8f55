"""The options a command reads histories with (--source, --metric, --fp16): kept apart from the
readers so that registering a command imports neither torch nor tensorboard."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from normlab.launch.histories.sources import AUTO, SOURCES, parse_overrides


@dataclass(frozen=True)
class HistoryOptions:
    source: str = AUTO
    metrics: dict[str, str] = field(default_factory=dict)  # --metric NAME=COLUMN
    fp16: bool = False


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


def history_options(args: argparse.Namespace) -> HistoryOptions:
    return HistoryOptions(args.source, parse_overrides(args.metric), args.fp16)
