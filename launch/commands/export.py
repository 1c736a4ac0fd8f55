"""`normlab export RUN_DIR --out DIR [--step N] [--overwrite]`: one checkpoint of any engine ->
a folder that HF transformers loads directly, plus normlab's own files (launch.export)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="a run's checkpoint as a HF transformers folder (+ normlab's own files)"
    )
    p.add_argument(
        "run_dir", help="a run directory (holding config.yaml), or a run name (runs/NAME)"
    )
    p.add_argument("--out", required=True, help="output directory (refused if it exists)")
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing export in --out, once the new one is complete",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer to ship: a SentencePiece .model, a tokenizer.json or a tokenizer folder "
        "(default: the one of the run's data.dataset)",
    )
    p.add_argument(
        "--no-hf",
        action="store_true",
        help="native format only (the tokenizer file and normlab/); needs no transformers",
    )
    p.add_argument(
        "--allow-unverified",
        action="store_true",
        help="export a checkpoint that has no manifest.json (its files cannot be verified)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from normlab.launch.export import export, resolve_run_dir
    from normlab.launch.progress import Stages

    run_dir = resolve_run_dir(args.run_dir)
    with Stages("export") as stages, stages.stage(f"{run_dir} -> {args.out}") as tick:
        lines = export(
            run_dir,
            Path(args.out),
            args.step,
            not args.no_hf,
            args.overwrite,
            args.tokenizer,
            args.allow_unverified,
        )
        tick()
    for line in lines:
        print(line)
    return 0
