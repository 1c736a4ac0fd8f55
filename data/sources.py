"""Read input text through HF `datasets` as a table of documents with columns
`text` and `contig` (True when the row's text continues in the next row of the same source).

A `.txt` file is read by lines and regrouped into chunks of `chunk_lines` lines: the chunk is the
unit of the train/val split and of parallel tokenisation. `.jsonl`/`.json`/`.parquet` rows and Hub
dataset rows are one document each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data.errors import DataError
from data.tokenizer import file_sha256

FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
}


def describe_sources(inputs: list[str]) -> list[dict[str, Any]]:
    """Validate local inputs; name, size and sha256 of each (the fingerprint hashes content)."""
    out = []
    for s in inputs:
        p = Path(s).expanduser()
        if not p.is_file():
            raise DataError(f"input file not found: {s}")
        if p.suffix.lower() not in FORMATS:
            raise DataError(f"{s}: unsupported file type {p.suffix!r} (use {', '.join(FORMATS)})")
        out.append(
            {
                "path": str(p.resolve()),
                "name": p.name,
                "bytes": p.stat().st_size,
                "sha256": file_sha256(p),
                "format": FORMATS[p.suffix.lower()],
            }
        )
    return out


def _join_lines(batch: dict[str, list]) -> dict[str, list]:
    return {"text": ["".join(batch["text"])]}


def _load_text(src: dict[str, Any], cache: Path, chunk_lines: int) -> Any:
    from datasets import load_dataset

    lines = load_dataset(
        "text", data_files=src["path"], split="train", cache_dir=str(cache), keep_linebreaks=True
    )
    # One batch per chunk: single-process map keeps batches aligned at multiples of chunk_lines.
    chunks = lines.map(
        _join_lines,
        batched=True,
        batch_size=chunk_lines,
        remove_columns=lines.column_names,
        cache_file_name=str(cache / f"chunks-{src['sha256'][:16]}.arrow"),
        desc=f"chunking {src['name']}",
    )
    n = len(chunks)
    return chunks.add_column("contig", [i < n - 1 for i in range(n)])


def _load_records(ds: Any, text_field: str, where: str) -> Any:
    if text_field not in ds.column_names:
        raise DataError(
            f"{where}: no column {text_field!r} (columns: {ds.column_names}); set --text-field"
        )
    ds = ds.select_columns([text_field])
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    return ds.add_column("contig", [False] * len(ds))


def load_documents(
    sources: list[dict[str, Any]], cache: Path, text_field: str, chunk_lines: int
) -> Any:
    """Concatenated `datasets.Dataset` of documents from local files, in input order."""
    from datasets import concatenate_datasets, load_dataset

    parts = []
    for src in sources:
        if src["format"] == "text":
            parts.append(_load_text(src, cache, chunk_lines))
            continue
        try:
            ds = load_dataset(
                src["format"], data_files=src["path"], split="train", cache_dir=str(cache)
            )
        except Exception as e:  # malformed JSON/parquet surfaces as several exception types
            raise DataError(f"cannot read {src['path']} as {src['format']}: {e}") from None
        parts.append(_load_records(ds, text_field, src["path"]))
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def load_hub_documents(name: str, split: str, cache: Path, text_field: str) -> Any:
    """A Hub dataset's rows as documents; a clear DataError when it cannot be fetched."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        raise DataError(
            f"dataset {name!r} needs the Hugging Face Hub but HF_HUB_OFFLINE is set; "
            "pass local files instead"
        )
    try:
        ds = datasets.load_dataset(name, split=split, cache_dir=str(cache))
    except Exception as e:  # network, auth and not-found errors have no common base class
        raise DataError(
            f"could not load dataset {name!r} (split {split!r}) from the Hub; "
            f"offline or wrong name? ({type(e).__name__}: {e})"
        ) from None
    return _load_records(ds, text_field, f"dataset {name}")
