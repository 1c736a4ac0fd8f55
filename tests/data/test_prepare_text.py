"""The block-wise text reader (prepare_text) cuts the same chunks as the line-by-line one, across
block boundaries, multi-byte characters split between blocks and a missing final newline."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from normlab.data import prepare_text
from normlab.data.prepare_text import _fast_chunks, _slow_chunks, scan_utf8


@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("chunk_lines", [1, 3, 7])
def test_fast_chunks_match_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, final_newline: bool, chunk_lines: int
) -> None:
    monkeypatch.setattr(prepare_text, "BLOCK", 37)  # blocks cut lines and characters
    rng = random.Random(chunk_lines)
    words = ["caf\u00e9", "\u65e5\u672c", "\U0001f600", "a", "", "  x\r", "\t"]
    lines = [" ".join(rng.choices(words, k=rng.randint(0, 6))) for _ in range(200)]
    text = "\n".join(lines) + ("\n" if final_newline else "")
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    want = list(_slow_chunks(path, chunk_lines))
    assert list(_fast_chunks(path, chunk_lines)) == want and "".join(want) == text
    digest, sizes = scan_utf8(path, chunk_lines)
    assert sizes.tolist() == [len(c.encode()) for c in want] and np.sum(sizes) == len(text.encode())
    path.write_bytes(b"ok\n\xe9\n")
    assert scan_utf8(path, chunk_lines) is None  # not UTF-8: the line-by-line path
