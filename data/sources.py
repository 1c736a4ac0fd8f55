"""Read input text through HF `datasets` as a table of documents with columns
`text` and `contig` (True when the row's text continues in the next row of the same source).

A `.txt` file is read by lines and regrouped into chunks of `chunk_lines` lines: the chunk is the
unit of the train/val split and of parallel tokenisation. `.jsonl`/`.json`/`.parquet` rows and Hub
dataset rows are one document each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.data.errors import DataError
from normlab.data.tokenizer import file_sha256

FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
}


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given; a directory contributes its files of a supported type (recursively, in
    sorted order, hidden ones skipped)."""
    out: list[Path] = []
    for s in inputs:
        p = Path(s).expanduser()
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and f.suffix.lower() in FORMATS
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )  # fmt: skip
            if not found:
                raise DataError(f"directory {s} holds no {', '.join(FORMATS)} files")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"input file not found: {s}")
    return out


def scan_text(path: Path, skip_undecodable: bool) -> int:
    """Check a text input before `datasets` reads it: not empty, not binary, UTF-8. Returns the
    number of undecodable lines (allowed only with skip_undecodable; they are left out)."""
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty")
    with path.open("rb") as fh:
        head = fh.read(1 << 16)
        if b"\x00" in head:
            raise DataError(f"{path} looks binary (NUL bytes), not a text file")
        fh.seek(0)
        bad, first, number = 0, 0, 0
        for number, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad, first = bad + 1, first or number
    if bad == number:
        raise DataError(f"{path} holds no UTF-8 text (all {bad} lines are undecodable)")
    if bad and not skip_undecodable:
        raise DataError(
            f"{path} is not UTF-8 text ({bad} undecodable lines, the first is line {first}); "
            "convert it (iconv -f latin1 -t utf-8) or pass --skip-undecodable to leave them out"
        )
    return bad


def describe_sources(inputs: list[str], skip_undecodable: bool = False) -> list[dict[str, Any]]:
    """Validate local inputs; name, size and sha256 of each (the fingerprint hashes content)."""
    out = []
    for p in expand_inputs(inputs):
        if p.suffix.lower() not in FORMATS:
            raise DataError(f"{p}: unsupported file type {p.suffix!r} (use {', '.join(FORMATS)})")
        try:
            bad = scan_text(p, skip_undecodable) if FORMATS[p.suffix.lower()] == "text" else 0
            digest = file_sha256(p)
        except OSError as exc:
            raise DataError(f"cannot read {p}: {exc.strerror or exc}") from None
        out.append(
            {
                "path": str(p.resolve()),
                "name": p.name,
                "bytes": p.stat().st_size,
                "sha256": digest,
                "format": FORMATS[p.suffix.lower()],
                "skipped_lines": bad,
            }
        )
    return out


def _utf8_copy(src: dict[str, Any], cache: Path) -> str:
    """A copy of a text input without its undecodable lines (counted in describe_sources)."""
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"utf8-{src['sha256'][:16]}.txt"
    with open(src["path"], "rb") as fin, out.open("wb") as fout:
        for line in fin:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                continue
            fout.write(line)
    return str(out)


def _join_lines(batch: dict[str, list]) -> dict[str, list]:
    return {"text": ["".join(batch["text"])]}


def _load_text(src: dict[str, Any], cache: Path, chunk_lines: int) -> Any:
    from datasets import load_dataset

    path = _utf8_copy(src, cache) if src.get("skipped_lines") else src["path"]
    lines = load_dataset(
        "text", data_files=path, split="train", cache_dir=str(cache), keep_linebreaks=True
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
    kind = getattr(ds.features[text_field], "dtype", None)
    if kind not in ("string", "large_string"):
        raise DataError(
            f"{where}: column {text_field!r} holds {ds.features[text_field]}, not text; set "
            "--text-field to a text column"
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
