"""torchrun as `normlab launch` runs it: the same agent, without its exit-time tracebacks.

`python -P -m normlab.launch.cluster.agent ARGS` takes torchrun's own arguments
(`torch.distributed.run.parse_args` and `run`, torch's public entry points) and differs only in
how it ends:

* a signal (Ctrl-C, SIGTERM, SIGUSR1): torchrun passes it to the ranks, which checkpoint and say
  so; torchrun then raises `SignalException` out of its main, a 30-line traceback after the
  checkpoint line. Here it is status 128 + signal, silently.
* a failed rank: torchrun raises `ChildFailedError`, a traceback plus a failure table. Here it is
  the first failed rank's status (128 + signal for a killed one); the rank printed its own error.
  A rank that refused has left its message for the launcher, so torchrun's log lines about that
  failure (and about stopping the other ranks) are dropped.

`-P` keeps the working directory off sys.path, so a user's `torch/` or `normlab/` cannot shadow.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from normlab.launch.rank_errors import ERRORS_ENV, first_report


class _DropUserErrorFailures(logging.Filter):
    """Once a rank has left its refusal for the launcher (in $NORMLAB_LAUNCH_ERRORS), drop
    torchrun's lines about it: `Sending process ... closing signal` (the other ranks being
    stopped, logged first) and `failed (exitcode: 2) ...`. The launcher prints the refusal."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if not msg.startswith(("failed (exitcode", "Sending process")):
            return True
        folder = os.environ.get(ERRORS_ENV)
        return not (folder and first_report(Path(folder)) is not None)


def status_of(exitcode: int) -> int:
    """A shell's exit status for a child's return code (negative: killed by that signal)."""
    return 128 - exitcode if exitcode < 0 else exitcode


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        _DropUserErrorFailures()
    )
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        return status_of(failure.exitcode) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
