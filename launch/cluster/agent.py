"""torchrun as `normlab launch` runs it: the same agent, without its exit-time tracebacks.

`python -P -m normlab.launch.cluster.agent ARGS` takes torchrun's own arguments
(`torch.distributed.run.parse_args` and `run`, torch's public entry points) and differs only in
how it ends:

* a signal (Ctrl-C, SIGTERM, SIGUSR1): torchrun passes it to the ranks, which checkpoint and say
  so; torchrun then raises `SignalException` out of its main, a 30-line traceback after the
  checkpoint line. Here it is status 128 + signal, silently.
* a failed rank: torchrun raises `ChildFailedError`, a traceback plus a failure table. Here it is
  the first failed rank's status (128 + signal for a killed one); the rank printed its own error.
  A rank that refused with status 2 has left its message for the launcher, so torchrun's
  "failed (exitcode: 2)" log line, and its lines about stopping the other ranks, are dropped.

`-P` keeps the working directory off sys.path, so a user's `torch/` or `normlab/` cannot shadow.
"""

from __future__ import annotations

import logging
import sys

from normlab.launch.training.launched import USER_ERROR_STATUS


class _DropUserErrorFailures(logging.Filter):
    """Drop torchrun's `failed (exitcode: 2) ...` records, and its `Sending process ... closing
    signal` records that follow (the other ranks being stopped): the launcher prints the refusal."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("failed (exitcode") and args and args[0] == USER_ERROR_STATUS:
            self.refused = True
            return False
        return not (self.refused and msg.startswith("Sending process"))


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
