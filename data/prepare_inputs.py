"""The inputs of `prepare`, read as streams of documents in bounded memory.

A document is a chunk of `chunk_lines` lines of a text file (the last chunk of a file does not
continue into the next one), or one row of a jsonl/json/parquet file or Hub dataset. `scan_source`
reads each input once before anything is built: it hashes the bytes (the fingerprint), checks
UTF-8, counts documents (the split needs their number) and their sizes (the tokenizer sample), and
counts the rows it will drop (no text field, null, not a string). `iter_documents` then yields the
same documents in the same order, as many times as the pipeline needs them.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.prepare_text import lines, scan_text, text_chunks

TEXT = ("txt", "text", "md", "markdown", "rst")  # read as plain text, by lines
FORMATS = {f".{s}": "text" for s in TEXT} | {".jsonl": "json", ".json": "json"}
FORMATS[".parquet"] = "parquet"
READ_BYTES = 1 << 20
ROW_BATCH = 4096  # parquet/Hub rows read at a time
HIDDEN = "<hidden>"  # a file under a name starting with '.', counted among the skipped


def expand_inputs(inputs: list[str]) -> tuple[list[Path], list[Path]]:
    """(files to read, files skipped). Files given by name must have a supported type; a directory
    contributes its supported files (recursively, sorted, hidden ones left out) and the others
    are returned as skipped so `prepare` can name them (hidden ones as HIDDEN, counted)."""
    out: list[Path] = []
    skipped: list[Path] = []
    for s in inputs:
        p = Path(s).expanduser()
        if p.is_dir():
            every = sorted(f for f in p.rglob("*") if f.is_file())
            files = [f for f in every if not any(x.startswith(".") for x in f.relative_to(p).parts)]
            found = [f for f in files if f.suffix.lower() in FORMATS]
            skipped += [f for f in files if f.suffix.lower() not in FORMATS]
            skipped += [Path(HIDDEN)] * (len(every) - len(files))
            if not found:
                raise DataError(f"directory {s} holds no {', '.join(FORMATS)} files")
            out += found
        elif p.is_file():
            if p.suffix.lower() not in FORMATS:
                raise DataError(
                    f"{p}: unsupported file type {p.suffix!r} (use {', '.join(FORMATS)})"
                )
            out.append(p)
        else:
            raise DataError(f"input file not found: {s}")
    return out, skipped


def _row_text(row: Any, field: str) -> str | None:
    """The text of a json row, or None when the row has no string under `field`."""
    value = row.get(field) if isinstance(row, dict) else None
    return value if isinstance(value, str) else None


def _is_json_array(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip()
    return head.startswith(b"[")


def _json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a jsonl file (or of a json file holding one object per line), streamed; a json
    array is read whole (json has no streaming array reader in the standard library)."""
    if _is_json_array(path):
        try:
            rows = json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path} is not valid JSON: {e}") from None
        yield from enumerate(rows, 1)
        return
    for number, _, text in lines(path):
        if text is None:
            raise DataError(f"{path}:{number} is not UTF-8")
        if not text.strip():
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number} is not a JSON object ({e.msg})") from None


def _parquet_texts(path: Path, field: str) -> Iterator[str | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"cannot read {path} as parquet: {e}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DataError(f"{path}: no column {field!r} (columns: {names}); set --text-field")
    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(
            f"{path}: column {field!r} holds {kind}, not text; set --text-field to a text column"
        )
    for batch in pf.iter_batches(batch_size=ROW_BATCH, columns=[field]):
        yield from batch.column(0).to_pylist()


_HUB: dict[tuple[str, str], Any] = {}


def load_hub(name: str, split: str, field: str) -> Any:
    """A Hub dataset (downloaded once into the datasets cache, read as Arrow from disk)."""
    import datasets

    if (name, split) in _HUB:
        return _HUB[name, split]
    if datasets.config.HF_HUB_OFFLINE:
        raise DataError(
            f"dataset {name!r} needs the Hugging Face Hub but HF_HUB_OFFLINE is set; "
            "pass local files instead"
        )
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # network, auth and not-found errors have no common base class
        raise DataError(
            f"could not load dataset {name!r} (split {split!r}) from the Hub; "
            f"offline or wrong name? ({type(e).__name__}: {e})"
        ) from None
    if field not in ds.column_names:
        raise DataError(
            f"dataset {name}: no column {field!r} (columns: {ds.column_names}); set --text-field"
        )
    _HUB[name, split] = ds
    return ds


def _hub_texts(ds: Any, field: str) -> Iterator[str | None]:
    for batch in ds.select_columns([field]).iter(batch_size=ROW_BATCH):
        yield from batch[field]


def _texts(src: dict[str, Any], settings: dict[str, Any]) -> Iterator[tuple[str | None, bool]]:
    """(text or None for a row to drop, continues-into-next) per document of one source."""
    field = settings["text_field"]
    if "dataset" in src:
        for text in _hub_texts(load_hub(src["dataset"], src["split"], field), field):
            yield text, False
    elif src["format"] == "parquet":
        for text in _parquet_texts(Path(src["path"]), field):
            yield text, False
    elif src["format"] == "json":
        for _, row in _json_rows(Path(src["path"])):
            yield _row_text(row, field), False
    else:
        yield from text_chunks(
            Path(src["path"]), settings["chunk_lines"], src.get("skipped_lines", 0) == 0
        )


def iter_documents(
    srcs: list[dict[str, Any]], settings: dict[str, Any]
) -> Iterator[tuple[str, bool]]:
    """(text, continues-into-next) of every kept document of every source, in input order."""
    for src in srcs:
        for text, contig in _texts(src, settings):
            if text is not None:
                yield text, contig


def scan_source(
    src: dict[str, Any], settings: dict[str, Any], skip_undecodable: bool
) -> tuple[dict[str, Any], np.ndarray]:
    """Read one source once: (its description for meta.json, the UTF-8 bytes of each kept
    document). Refuses an empty, binary or non-UTF-8 file (unless skip_undecodable) and a
    record file of which no row has the text field."""
    if "dataset" in src:
        sizes = array("q", (len(t.encode()) for t, _ in _texts(src, settings) if t is not None))
        return src | {"documents": len(sizes)}, np.frombuffer(sizes, dtype=np.int64)
    path = Path(src["path"])
    if src["bytes"] == 0:
        raise DataError(f"{path} is empty")
    with path.open("rb") as fh:
        if src["format"] != "parquet" and b"\x00" in fh.read(1 << 16):
            raise DataError(f"{path} looks binary (NUL bytes), not a text file")
    if src["format"] == "text":
        return scan_text(src, settings["chunk_lines"], skip_undecodable)
    sizes, dropped = array("q"), 0  # 8 bytes a document, not a Python int each
    for text, _ in _texts(src, settings):
        if text is None:
            dropped += 1
        else:
            sizes.append(len(text.encode()))
    if not sizes:
        raise DataError(
            f"{path}: no row holds text under {settings['text_field']!r} ({dropped} rows; the "
            f"first has {_first_row(src, settings['text_field'])}); set --text-field"
        )
    desc = src | {"sha256": file_sha256(path), "documents": len(sizes), "dropped_rows": dropped}
    return desc, np.frombuffer(sizes, dtype=np.int64)


def _first_row(src: dict[str, Any], field: str) -> str:
    """What the first row holds instead of text under `field`, for the error message."""
    if src["format"] == "parquet":
        return "null"
    for _, row in _json_rows(Path(src["path"])):
        if not isinstance(row, dict):
            return f"a {type(row).__name__}, not an object"
        if field not in row:
            return f"the fields {sorted(row)}"
        return f"{field!r}: {type(row[field]).__name__}"
    return "nothing"


def describe(path: Path) -> dict[str, Any]:
    """What the fingerprint and meta.json record of an input before it is scanned."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    fmt = FORMATS[path.suffix.lower()]
    return {"path": str(path.resolve()), "name": path.name, "bytes": size, "format": fmt}


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(READ_BYTES), b""):
            h.update(block)
    return h.hexdigest()
