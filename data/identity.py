"""What a checkpoint records of each data source it was trained on, and what changed since.

A source's identity is three things, each cheap to compute on every start:

- `tokenizer`: the sha256 of its tokenizer file as meta.json records it (`tokenizer_id`);
- `shards`: a sha256 over meta.json (without its volatile keys: `created`, `timings_s` and the
  tokenizer's `source` path, so the same preparation made again counts as the same) and, for each
  of train.bin and val.bin, its name, its size in bytes and the bytes of its first and last
  `EDGE_BYTES`. Shards are never read whole (they may be many GB): a re-prepared text or another
  directory changes meta.json's input fingerprint and token counts, and in practice the edges too;
  an edit in the middle of a shard that keeps its size and meta.json is not seen (nothing in
  normlab writes one);
- `sequences`: the number of training windows of seq_len + 1 tokens (what the sample order is a
  permutation of).

The directory's path is recorded for the message only: a moved directory with the same contents
is the same source.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

EDGE_BYTES = 64 * 1024  # read from each end of a shard
SHARDS = ("train.bin", "val.bin")
VOLATILE = ("created", "timings_s")  # meta.json keys that differ between identical preparations
ASPECTS = ("tokenizer", "shards", "sequences")
ASPECT_WORDS = {"tokenizer": "tokenizer", "shards": "shards", "sequences": "sequence count"}


def tokenizer_id(meta: dict[str, Any]) -> str:
    """What identifies a prepared directory's tokenizer: the sha256 of its tokenizer file."""
    tok = meta.get("tokenizer") or {}
    return str(tok.get("sha256") or f"vocab-{meta.get('vocab_size')}")


def shards_fingerprint(data_dir: Path, meta: dict[str, Any]) -> str:
    """sha256 over meta.json's stable content and each shard's name, size, first and last
    EDGE_BYTES (module docstring)."""
    stable = {k: v for k, v in meta.items() if k not in VOLATILE}
    if isinstance(stable.get("tokenizer"), dict):
        stable["tokenizer"] = {k: v for k, v in stable["tokenizer"].items() if k != "source"}
    h = hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode())
    for name in SHARDS:
        path = data_dir / name
        size = path.stat().st_size
        h.update(f"{name}:{size}".encode())
        with path.open("rb") as fh:
            h.update(fh.read(EDGE_BYTES))
            fh.seek(max(0, size - EDGE_BYTES))
            h.update(fh.read(EDGE_BYTES))
    return h.hexdigest()


def source_identity(
    name: str, data_dir: Path, meta: dict[str, Any], sequences: int
) -> dict[str, Any]:
    """The identity of one source (`meta` is its meta.json, already read and checked)."""
    return {
        "name": name,
        "path": str(data_dir),
        "tokenizer": tokenizer_id(meta),
        "shards": shards_fingerprint(Path(data_dir), meta),
        "sequences": int(sequences),
    }


def _short(value: Any) -> str:
    s = str(value)
    return f"{s[:12]}..." if len(s) > 16 else s


def identity_changes(saved: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """One phrase per source whose identity differs, e.g. "source 'plays' (/d, was /d): tokenizer
    (sha256 1a2b... -> 3c4d...), sequence count (1200 -> 1180)"; sources are matched by name (the
    loader state refuses other names). Empty when nothing changed."""
    before = {str(s.get("name")): s for s in saved if isinstance(s, dict)}
    out = []
    for cur in now:
        old = before.get(cur["name"])
        if old is None:
            continue
        parts = []
        for aspect in ASPECTS:
            if old.get(aspect) != cur[aspect]:
                word = ASPECT_WORDS[aspect]
                if aspect == "shards":
                    parts.append(f"{word} (other files)")
                else:
                    sha = "sha256 " if aspect == "tokenizer" else ""
                    was, new = _short(old.get(aspect)), _short(cur[aspect])
                    parts.append(f"{word} ({sha}{was} -> {new})")
        if parts:
            where = cur["path"]
            if old.get("path") and old.get("path") != where:
                where = f"{where}, trained on {old['path']}"
            out.append(f"source {cur['name']!r} ({where}): {', '.join(parts)}")
    return out
