"""The one JSON reader of normlab: every JSON or JSON-lines file a run or a command wrote
(summary.json, metrics.jsonl, study.json, verdicts.json, a manifest) is parsed here, and a bad one
is refused with one line naming the file, the line and what was expected; reading writes nothing.

`read_json` checks the bytes (UTF-8), the syntax and that no object names a key twice (Python's
json keeps the last copy silently, so a hand-edited file could carry two different values for one
field). `read_json_lines` does the same line by line; a last line cut short (a run still writing,
or killed mid-line) is left out rather than refused. The value checks (`count`, `loss`,
`nonnegative`, `positive`) take a parsed value and the place it came from.

Non-finite numbers: normlab writes them as the strings 'nan', 'inf', '-inf' in metrics.jsonl, and
as the JSON extensions NaN/Infinity where json.dumps does; both read back as floats here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.launch.errors import NormlabError

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class BadJSON(NormlabError):
    """A JSON file cannot be read as what normlab wrote (or a user was asked to write) there."""


def text_of(path: Path, what: str, error: Callable[[str], Exception] = BadJSON) -> str:
    """The file's text: unreadable or not UTF-8 is one line naming the file and the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{path} is damaged: bytes that are not UTF-8 text on line {line} (byte {exc.start})"
        ) from None


def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _KeyTwice(key)
        out[key] = value
    return out


class _KeyTwice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse(text: str, where: str, error: Callable[[str], Exception] = BadJSON) -> Any:
    """One JSON document; `where` names it (a file, or a file and a line) in the message."""
    try:
        return json.loads(text, object_pairs_hook=_no_key_twice)
    except _KeyTwice as exc:
        raise error(f"{where}: key {exc.key!r} is given twice in one object") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{where} is not valid JSON (nested too deeply)") from None


def read_json(
    path: Path, what: str, error: Callable[[str], Exception] = BadJSON, fix: str = ""
) -> Any:
    """The JSON document in `path` (`what` names it in messages; `fix` is appended to them)."""
    suffix = f"; {fix}" if fix else ""

    def fail(message: str) -> Exception:
        return error(message + suffix)

    return parse(text_of(path, what, fail), str(path), fail)


def read_json_lines(
    path: Path, what: str, error: Callable[[str], Exception] = BadJSON, fix: str = ""
) -> list[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON-lines file; a last line that is not
    JSON is one cut short by a writer and is left out, any earlier one is refused."""
    suffix = f"; {fix}" if fix else ""

    def fail(message: str) -> Exception:
        return error(message + suffix)

    lines = text_of(path, what, fail).splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line, object_pairs_hook=_no_key_twice)))
        except _KeyTwice as exc:
            raise fail(f"{path} is damaged: line {number} gives key {exc.key!r} twice") from None
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines):
                break  # half-written by a run that is running or was killed
            raise fail(f"{path} is damaged: line {number} is not JSON") from None
    return out


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number (not a bool), or a non-finite one written as 'nan'/'inf'/'-inf'."""
    return (isinstance(value, int | float) and not isinstance(value, bool)) or (
        isinstance(value, str) and value in NON_FINITE
    )


def as_float(value: Any) -> float:
    """A value `is_number` accepts, as a float."""
    return NON_FINITE[value] if isinstance(value, str) else float(value)


def count(value: Any) -> bool:
    """A step, a token count: an integer >= 0 (3.0 and True are not)."""
    return is_int(value) and value >= 0


def loss(value: Any) -> bool:
    """A cross-entropy in nats: >= 0, or non-finite (nan, +inf: a diverged run)."""
    if not is_number(value):
        return False
    x = as_float(value)
    return math.isnan(x) or x >= 0


def nonnegative(value: Any) -> bool:
    """A time, a rate, a norm: a finite number >= 0."""
    return is_number(value) and math.isfinite(as_float(value)) and as_float(value) >= 0
