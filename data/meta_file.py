"""A prepared data directory's meta.json: its name, the token dtype rule, and the one reader of
the file (every command that reads a meta.json reads it here). Light on purpose: commands that
answer at once (plan, submit --dry-run, compare) read a recipe's vocabulary through it without
loading a tokenizer library (tests/launch/test_cli_startup.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from normlab.data.errors import DataError

META = "meta.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id in [0, vocab_size) fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def load_meta(path: Path) -> dict[str, Any]:
    """A meta.json read and checked (the one reader of this file kind): UTF-8 JSON, no key twice
    (launch.json_file), an object whose vocab_size is an integer > 0, dtype the one token_dtype
    gives for it, tokens a count >= 0 per split (train, val), tokenizer an object naming its
    file. DataError names the file and the key."""
    from normlab.launch.json_file import read_json

    fix = "re-run `normlab prepare`"
    meta = read_json(path, "prepared data's meta.json", DataError, fix=fix)

    def bad(key: str, expected: str) -> DataError:
        got = meta.get(key, "missing") if isinstance(meta, dict) else meta
        return DataError(f"{path}: {key} is {got!r}, expected {expected}; {fix}")

    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(meta).__name__}; {fix}")
    vocab = meta.get("vocab_size")
    if not _whole(vocab) or vocab <= 0:
        raise bad("vocab_size", "an integer > 0")
    if meta.get("dtype") != token_dtype(vocab).name:
        raise bad("dtype", f"{token_dtype(vocab).name!r} (the token dtype of vocab_size {vocab})")
    tokens = meta.get("tokens")
    if not (
        isinstance(tokens, dict)
        and set(tokens) == {"train", "val"}
        and all(_whole(n) and n >= 0 for n in tokens.values())
    ):
        raise bad("tokens", "{'train': count, 'val': count}, counts integers >= 0")
    tok = meta.get("tokenizer", {})
    if not isinstance(tok, dict) or not isinstance(tok.get("file", ""), str):
        raise bad("tokenizer", "an object naming its file")
    return meta


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def meta_of(dataset: str | Path) -> dict[str, Any] | None:
    """The checked meta.json of a dataset that has one; None for 'bundled' or a directory that
    holds none (moved or deleted since a run); DataError when it is there and damaged."""
    if str(dataset) == "bundled":
        return None
    path = Path(dataset).expanduser() / META
    return load_meta(path) if path.is_file() else None
