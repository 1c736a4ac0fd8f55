"""`prepare` subcommand: `normlab prepare [INPUTS...] --out DIR ...`
(also `python -m normlab.data.cli`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from normlab.data.errors import DataError

DEFAULT_ROOT = Path("runs") / "data"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `prepare` to an argparse subparsers object; sets `func(args) -> int`."""
    p = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into train.bin/val.bin (default: the bundled Shakespeare corpus)",
        description="Tokenize (with a SentencePiece tokenizer trained here, or your own "
        "tokenizer) into packed token arrays, streaming, with --num-proc processes.",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        help=".txt/.jsonl/.json/.parquet files or directories of them (default: bundled)",
    )
    p.add_argument("--out", type=Path, help="output dir (default: runs/data/<name>)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="use this tokenizer instead of training one: a SentencePiece .model, a HF "
        "tokenizer.json, or a tokenizer folder holding tokenizer.json",
    )
    for name in ("bos", "eos", "pad"):
        p.add_argument(
            f"--{name}-token",
            metavar="TOKEN",
            help=f"the {name.upper()} token of a HF --tokenizer (default: its own, or the usual "
            "names)",
        )
    p.add_argument("--val-fraction", type=float, default=0.005)
    p.add_argument("--dataset", help="Hugging Face Hub dataset name (needs network)")
    p.add_argument("--dataset-split", default="train")
    p.add_argument("--text-field", default="text", help="text column for jsonl/parquet/Hub rows")
    p.add_argument("--num-proc", type=int, default=2, help="tokenizer processes")
    p.add_argument(
        "--batch-mb",
        type=float,
        default=1.0,
        help="MB of text per tokenizer batch: memory grows with it (a worker holds ~30x its "
        "batch while encoding), not with the corpus",
    )
    p.add_argument("--seed", type=int, default=0, help="train/val split seed")
    p.add_argument("--overwrite", action="store_true", help="replace a differently prepared --out")
    p.add_argument(
        "--skip-undecodable",
        action="store_true",
        help="leave out lines of .txt inputs that are not UTF-8 (counted) instead of stopping",
    )
    p.set_defaults(func=run_prepare)
    return p


def default_out(args: argparse.Namespace) -> Path:
    """runs/data/<name>: the dataset name, the first input's stem, or `shakespeare`."""
    if args.dataset:
        name = args.dataset
    elif args.inputs:
        name = Path(args.inputs[0]).stem
    else:
        name = "shakespeare"
    return DEFAULT_ROOT / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "data")


def run_prepare(args: argparse.Namespace) -> int:
    from normlab.data.prepare import prepare

    try:
        prepare(
            args.inputs or None,
            args.out or default_out(args),
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            tokenizer=args.tokenizer,
            token_names={
                n: getattr(args, f"{n}_token")
                for n in ("bos", "eos", "pad")
                if getattr(args, f"{n}_token")
            },
            batch_mb=args.batch_mb,
            val_fraction=args.val_fraction,
            text_field=args.text_field,
            num_proc=args.num_proc,
            seed=args.seed,
            dataset_name=args.dataset,
            dataset_split=args.dataset_split,
            overwrite=args.overwrite,
            skip_undecodable=args.skip_undecodable,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m normlab.data.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
