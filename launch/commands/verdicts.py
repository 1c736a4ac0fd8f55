"""`normlab verdicts RESULTS.csv`: decide claims on any table of runs (SCIENCE.md 22).

Prints one line per verdict (numbers, interval, level, rule) and writes verdicts.md and
verdicts.json into --out. The table needs the columns recipe, lr, seed, eval_loss, status (and
optionally size, l0/init_loss, eval_loss_25/50/75); see normlab.launch.verdicts.results_table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from normlab.launch.histories.options import add_history_options
from normlab.launch.out_path import default_out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "verdicts", help="decide claims on a table of runs: Welch/permutation, Holm, seeds needed"
    )
    p.add_argument(
        "results",
        nargs="?",
        help="CSV: recipe, size, lr, seed, eval_loss, status (+ l0 ...); with --plan: a pilot "
        "study's table whose seed spread plans the claims; or a folder of histories laid out "
        "as DIR/<recipe>/lr<lr>/seed<seed> (docs/guides/external_runs.md)",
    )
    p.add_argument(
        "--layout",
        default=None,
        metavar="FILE.csv",
        help="histories named by a mapping (columns path, recipe, lr, seed, size?) instead",
    )
    p.add_argument(
        "--eval-loss",
        default="final",
        choices=("final", "smoothed"),
        help="from histories: the last eval loss, or the median of the last three",
    )
    add_history_options(p)
    p.add_argument(
        "--claims",
        default=None,
        help="YAML list of {a, b, statistic, expect, size?}"
        " (default: every recipe pair gets the three claims)",
    )
    p.add_argument(
        "--plateau",
        type=float,
        default=None,
        help="the data's unigram loss: the trained range needs it (plateau - 0.2)",
    )
    p.add_argument(
        "--l0",
        type=float,
        default=None,
        help="the initial loss l_0 for every run (default: the table's l0/init_loss)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="margin in nats for the loss and sensitivity claims (default 0.1)",
    )
    p.add_argument(
        "--out", default=default_out("verdicts"), help="output folder (default: runs/verdicts)"
    )
    p.add_argument(
        "--aa",
        type=int,
        default=None,
        metavar="B",
        help="also run the simulated A/A self-test with B replicates (e.g. 2000)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="processes deciding the claims (default: every usable core; the answers do not "
        "depend on it)",
    )
    p.add_argument(
        "--plan",
        type=float,
        default=None,
        metavar="DELTA",
        help="plan a study instead: seeds per arm for 80%% power at a true difference DELTA "
        "(nats; grid steps for trained_range; above the margin a directional claim, below it "
        "equivalence), from --sd or the RESULTS pilot's spread",
    )
    p.add_argument("--sd", type=float, default=None, help="with --plan: the stated seed SD")
    p.add_argument(
        "--statistic",
        default="loss_at_best_lr",
        help="with --plan --sd: loss_at_best_lr, lr_sensitivity or trained_range",
    )
    p.add_argument(
        "--family",
        type=int,
        default=3,
        help="with --plan: the claims in the family (Holm's first level alpha / K; default 3)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.errors import ConfigError
    from normlab.launch.verdicts.report import plan_lines, run_verdicts
    from normlab.launch.verdicts.workers import usable_cores

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be a whole number >= 1, got {args.jobs}")
    jobs = usable_cores() if args.jobs is None else args.jobs

    if args.plan is not None:
        for text in plan_lines(
            args.results, args.plan, args.sd, args.statistic, args.family, args.plateau,
            args.margin, args.l0,
        ):  # fmt: skip
            print(text)
        return 0
    if args.layout is not None or (args.results is not None and Path(args.results).is_dir()):
        from normlab.launch.histories.options import history_options
        from normlab.launch.histories.results import verdicts_from_histories

        lines = verdicts_from_histories(
            args.results, args.layout, history_options(args), args.eval_loss, args.out,
            lambda table: run_verdicts(
                table, args.claims, args.plateau, args.l0, args.margin, args.out, args.aa, jobs
            ),
        )  # fmt: skip
        print("\n".join(lines))
        return 0
    if args.results is None:
        raise ConfigError("a results table is needed (or --plan DELTA with --sd SD)")

    for text in run_verdicts(
        args.results, args.claims, args.plateau, args.l0, args.margin, args.out, args.aa, jobs
    ):
        print(text)
    return 0
