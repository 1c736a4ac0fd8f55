"""Text files as documents of `chunk_lines` lines (split on b"\\n"), fast: blocks of bytes are
hashed, checked as UTF-8 and cut at every chunk_lines-th newline with numpy, without a Python
step per line. A file that is not all UTF-8 takes the line-by-line path, which leaves its
undecodable lines out (--skip-undecodable) and counts the kept lines into chunks."""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError

BLOCK = 8 << 20  # bytes read at a time


def _blocks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while block := fh.read(BLOCK):
            yield block


def _newlines(buf: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)


def scan_utf8(path: Path, chunk_lines: int) -> tuple[str, np.ndarray] | None:
    """(sha256, bytes of each chunk) of an all-UTF-8 file in one pass; None if it is not."""
    digest, decoder = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
    ends: list[np.ndarray] = []
    offset = lines_before = 0
    for block in _blocks(path):
        digest.update(block)
        try:
            decoder.decode(block)
        except UnicodeDecodeError:
            return None
        nl = _newlines(block)
        last = (lines_before + np.arange(1, len(nl) + 1)) % chunk_lines == 0
        ends.append(offset + nl[last] + 1)
        offset, lines_before = offset + len(block), lines_before + len(nl)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return None
    cut = np.concatenate([np.zeros(1, dtype=np.int64), *ends])
    if cut[-1] < offset:  # a last chunk of fewer lines (or without a final newline)
        cut = np.append(cut, offset)
    return digest.hexdigest(), np.diff(cut).astype(np.int64)


def _fast_chunks(path: Path, chunk_lines: int) -> Iterator[str]:
    pending = b""
    for block in _blocks(path):
        buf = pending + block
        nl = _newlines(buf)
        start = 0
        for end in nl[chunk_lines - 1 :: chunk_lines] + 1:
            yield buf[start:end].decode("utf-8")
            start = int(end)
        pending = buf[start:]
    if pending:
        yield pending.decode("utf-8")


def _slow_chunks(path: Path, chunk_lines: int) -> Iterator[str]:
    chunk: list[str] = []
    for _, _, text in lines(path):
        if text is None:
            continue
        chunk.append(text)
        if len(chunk) == chunk_lines:
            yield "".join(chunk)
            chunk = []
    if chunk:
        yield "".join(chunk)


def text_chunks(path: Path, chunk_lines: int, utf8: bool) -> Iterator[tuple[str, bool]]:
    """(chunk, continues-into-next): every chunk continues except the file's last one."""
    pending = None
    for chunk in (_fast_chunks if utf8 else _slow_chunks)(path, chunk_lines):
        if pending is not None:
            yield pending, True
        pending = chunk
    if pending is not None:
        yield pending, False


def lines(path: Path) -> Iterator[tuple[int, bytes, str | None]]:
    """(line number, raw bytes, decoded text or None when not UTF-8) of a file, by b'\\n'."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                yield number, raw, raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, raw, None


def scan_text(
    src: dict[str, Any], chunk_lines: int, skip_undecodable: bool
) -> tuple[dict[str, Any], np.ndarray]:
    """Describe a text source (sha256, documents, undecodable lines) and size its chunks."""
    fast = scan_utf8(Path(src["path"]), chunk_lines)
    if fast is not None:
        digest, sizes = fast
        desc = src | {"sha256": digest, "documents": len(sizes), "skipped_lines": 0}
        return desc, sizes
    return _scan_lines(src, chunk_lines, skip_undecodable)


def _scan_lines(
    src: dict[str, Any], chunk_lines: int, skip_undecodable: bool
) -> tuple[dict[str, Any], np.ndarray]:
    path, digest = Path(src["path"]), hashlib.sha256()
    bad = first = kept = 0
    sizes: list[int] = []
    for number, raw, text in lines(path):
        digest.update(raw)
        if text is None:
            bad, first = bad + 1, first or number
            continue
        if kept % chunk_lines == 0:
            sizes.append(0)
        sizes[-1] += len(raw)
        kept += 1
    if not kept:
        raise DataError(f"{path} holds no UTF-8 text (all {bad} lines are undecodable)")
    if bad and not skip_undecodable:
        raise DataError(
            f"{path} is not UTF-8 text ({bad} undecodable lines, the first is line {first}); "
            "convert it (iconv -f latin1 -t utf-8) or pass --skip-undecodable to leave them out"
        )
    desc = src | {"sha256": digest.hexdigest(), "documents": len(sizes), "skipped_lines": bad}
    return desc, np.asarray(sizes, dtype=np.int64)
