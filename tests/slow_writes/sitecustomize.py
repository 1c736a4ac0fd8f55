"""Test-only fault injection (on PYTHONPATH only in test_async_checkpoint's killed run): every
DCP file write sleeps NORMLAB_TEST_SLOW_WRITE_S first, so an asynchronous save stays in flight
long enough to kill the job in the middle of it. Imported by every Python process at start-up."""

import os

if os.environ.get("NORMLAB_TEST_SLOW_WRITE_S"):
    import time

    from torch.distributed.checkpoint import filesystem

    _write = filesystem.FileSystemWriter.write_data
    _delay = float(os.environ["NORMLAB_TEST_SLOW_WRITE_S"])

    def slow_write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        time.sleep(_delay)
        return _write(self, plan, planner)

    filesystem.FileSystemWriter.write_data = slow_write_data
