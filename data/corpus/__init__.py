"""The bundled public-domain corpus (Shakespeare, modern spelling; see PROVENANCE.md).

The text ships xz-compressed in the package; `bundled_corpus_path()` decompresses it once into a
cache directory and returns the path of the plain-text file.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tempfile
from pathlib import Path

CORPUS_XZ = Path(__file__).resolve().parent / "shakespeare.txt.xz"


def cache_dir() -> Path:
    """`$NORMLAB_CACHE`, else `~/.cache/normlab`."""
    env = os.environ.get("NORMLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "normlab"


def bundled_corpus_path() -> Path:
    """Path of the decompressed bundled corpus, decompressing it on first use.

    The cached name carries a hash of the compressed file, so a new corpus never reuses a stale
    cache; the write goes to a temporary file renamed into place, so concurrent callers and
    interrupted runs never see a partial file.
    """
    packed = CORPUS_XZ.read_bytes()
    digest = hashlib.sha256(packed).hexdigest()[:16]
    out = cache_dir() / f"shakespeare-{digest}.txt"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".shakespeare-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lzma.decompress(packed))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
