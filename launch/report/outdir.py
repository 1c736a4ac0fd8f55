"""The report commands' output folders: the one checked output path lives in launch/out_path.py
(below every room that writes a report); this name stays for the modules that import it here."""

from normlab.launch.out_path import (
    DEFAULT_OUT,
    RUNS,
    WRITES,
    OutDirError,
    check_out_dir,
    default_out,
    make_out_dir,
    write_text,
)

__all__ = [
    "DEFAULT_OUT",
    "RUNS",
    "WRITES",
    "OutDirError",
    "check_out_dir",
    "default_out",
    "make_out_dir",
    "write_text",
]
