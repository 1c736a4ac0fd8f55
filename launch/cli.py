"""`normlab` command line: one subcommand per module listed in COMMANDS.

A module joins the CLI by defining `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. User errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import os
import sys

from normlab.data.errors import DataError
from normlab.launch.errors import NormlabError

# One module per subcommand; a new command adds its module here.
COMMANDS = [
    "normlab.launch.commands.train",
    "normlab.launch.commands.validate",
    "normlab.data.cli",
    "normlab.launch.commands.quickstart",
    "normlab.launch.commands.launch",
    "normlab.launch.commands.export",
    "normlab.launch.commands.compare",
    "normlab.launch.commands.study",
    "normlab.launch.commands.submit",
    "normlab.launch.commands.status",
    "normlab.launch.commands.theory",
    "normlab.launch.commands.plan",
    "normlab.launch.commands.verdicts",
    "normlab.launch.commands.coordcheck",
    "normlab.launch.commands.warnings",
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
        if hasattr(args, "overrides"):  # KEY=VALUE settings: each once (the last would win)
            from normlab.launch.config.loader import check_once

            check_once(args.overrides)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except USER_ERRORS as exc:
        from normlab.launch.rank_errors import report_to_launcher

        if not report_to_launcher(str(exc)):  # a rank of `normlab launch`: its launcher prints
            print(f"normlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print(f"normlab {args.command}: error: {write_failure(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"normlab {args.command}: interrupted", file=sys.stderr)
        return 130


# A place normlab reads or writes can be read-only, not permitted or full: one line, exit 2
# (writers write a temporary file and rename it, so nothing half-written is left behind).
WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def write_failure(exc: OSError) -> str:
    where = exc.filename or "a file"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device while writing {where}: free space or write elsewhere"
    return f"{where}: {exc.strerror} (read-only, or owned by another user?)"


def _stdout_closed() -> int:
    """The reader of our stdout went away (`normlab validate pre | head -1`): stop quietly, as
    a process killed by SIGPIPE would (status 141), without the interpreter's exit-time flush
    into the closed pipe printing a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
