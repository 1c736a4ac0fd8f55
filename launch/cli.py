"""`normlab` command line: one subcommand per module listed in COMMANDS.

A module joins the CLI by defining `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. User errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from data.errors import DataError
from launch.errors import NormlabError

# One module per subcommand; a new command adds its module here.
COMMANDS = [
    "launch.commands.train",
    "launch.commands.validate",
    "data.cli",
    "launch.commands.quickstart",
    "launch.commands.launch",
    "launch.commands.export",
    "launch.commands.compare",
    "launch.commands.study",
    "launch.commands.submit",
    "launch.commands.status",
    "launch.commands.theory",
]
USER_ERRORS = (NormlabError, DataError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="normlab", description="Pretraining recipes where the norm placement is one switch."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if importlib.util.find_spec(name) is None:
            continue  # a command whose module is not installed in this checkout
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides may follow options (`validate r.yaml --quiet optim.lr=1e-3`).
    if extra and hasattr(args, "overrides") and all("=" in e and e[0] != "-" for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"normlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"normlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
