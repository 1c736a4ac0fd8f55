"""The one CSV reader of normlab: every table a user supplies or a run wrote (results.csv,
compare.csv, sensitivity.csv, a history) is read here, and a bad one is refused with one
ConfigError line naming the file, the row (1 = the first data row) and its line, the column and
what was expected; nothing is written by reading.

`read_table` checks the file as text (UTF-8, a byte-order mark allowed, as spreadsheet programs
write it), the header (present, no column named twice, the required columns there) and each
row's shape (no more fields than the header; a short row's missing fields are empty). The value
readers (`number`, `loss`, `count`, `positive`) check one cell's type and range, and
`unique` refuses a key (a run, a grid point) seen twice.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from normlab.launch.errors import ConfigError


@dataclass(frozen=True)
class Row:
    """One data row: its number (1 = the first), its line in the file and its cells."""

    number: int
    line: int
    cells: dict[str, str]

    @property
    def where(self) -> str:
        return f"row {self.number} (line {self.line})"

    def get(self, column: str, default: str = "") -> str:
        return self.cells.get(column, default)

    def __getitem__(self, column: str) -> str:
        return self.cells[column]


@dataclass(frozen=True)
class Table:
    path: Path
    header: list[str]
    rows: list[Row]

    def where(self, row: Row, column: str | None = None) -> str:
        return f"{self.path}: {row.where}" + (f", column {column}" if column else "")


def decode(data: bytes, path: Path, what: str) -> str:
    """The file's text; bytes that are not UTF-8 are one line naming the line they are on."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: the {what} is not UTF-8 text (byte {exc.start}, line {line}); save it as "
            "UTF-8 CSV"
        ) from None


def read_table(
    path: str | Path, what: str, required: Sequence[str] = (), short_rows: bool = True
) -> Table:
    """The CSV at `path` (`what` names it in messages: 'results table', 'compare.csv').
    `short_rows=False` for a table normlab writes whole (compare.csv): a row with fewer fields
    than the header was cut short and is refused."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    text = decode(data, path, what)
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ConfigError(f"{path}: the {what} is not CSV ({exc})") from None
    lines = _line_numbers(text, len(records))
    if not records or not any(h.strip() for h in records[0]):
        raise ConfigError(f"{path}: the {what} has no header row")
    header = [h.strip() for h in records[0]]
    twice = sorted({h for h in header if header.count(h) > 1 and h})
    if twice:
        raise ConfigError(f"{path}: the {what}'s header names column {twice[0]!r} twice")
    missing = [c for c in required if c not in header]
    if missing:
        raise ConfigError(f"{path}: missing column {', '.join(missing)} (header row)")
    rows: list[Row] = []
    for record, line in zip(records[1:], lines[1:], strict=True):
        if not any(cell.strip() for cell in record):
            continue  # a blank line
        number = len(rows) + 1
        if len(record) > len(header) or (len(record) < len(header) and not short_rows):
            raise ConfigError(
                f"{path}: row {number} (line {line}): {len(record)} fields, the header has "
                f"{len(header)} columns" + ("" if short_rows else " (a row cut short?)")
            )
        cells = dict(zip(header, [*record, *[""] * (len(header) - len(record))], strict=True))
        rows.append(Row(number, line, cells))
    return Table(path, header, rows)


def _line_numbers(text: str, n: int) -> list[int]:
    """The line each CSV record starts on (a quoted cell may span lines)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    starts, line = [], 1
    for _ in range(n):
        starts.append(line)
        next(reader)
        line = reader.line_num + 1
    return starts


def number(
    text: str,
    where: str,
    *,
    empty: bool = False,
    nonfinite: bool = False,
    minimum: float | None = None,
    what: str = "a number",
) -> float:
    """One numeric cell: nan for an empty one (when `empty`), 'nan'/'inf' only when `nonfinite`,
    and >= `minimum` when given (a non-finite value is not held to it, except -inf)."""
    text = text.strip()
    if not text:
        if empty:
            return math.nan
        raise ConfigError(f"{where}: empty, {what} is needed")
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not {what}") from None
    if not math.isfinite(value) and not nonfinite:
        raise ConfigError(f"{where}: {text!r} is not finite; {what} is needed")
    if minimum is not None and (value < minimum or value == -math.inf):
        raise ConfigError(f"{where}: {text!r} is below {minimum:g}; {what} is needed")
    return value


def loss(text: str, where: str, *, empty: bool = False, nonfinite: bool = True) -> float:
    """A cross-entropy in nats: >= 0; 'nan' or 'inf' (a diverged run) when `nonfinite`."""
    return number(
        text, where, empty=empty, nonfinite=nonfinite, minimum=0.0,
        what="a loss (a non-negative number of nats)",
    )  # fmt: skip


def positive(text: str, where: str, what: str = "a positive number") -> float:
    value = number(text, where, what=what)
    if value <= 0:
        raise ConfigError(f"{where}: {text.strip()!r} is not {what}")
    return value


def count(text: str, where: str, what: str = "a non-negative integer") -> int:
    """A seed, a step: a non-negative integer written as one ('3', not '3.0' or '-1')."""
    text = text.strip()
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not {what}") from None
    if value < 0:
        raise ConfigError(f"{where}: {text!r} is not {what}")
    return value


def unique(keys: Iterable[tuple[str, object]], path: Path, what: str) -> None:
    """Refuse a key seen twice: `keys` yields (where, key), where names the row."""
    seen: dict[object, str] = {}
    for where, key in keys:
        if key in seen:
            raise ConfigError(f"{path}: {where}: {what} {key} repeats {seen[key]}")
        seen[key] = where
