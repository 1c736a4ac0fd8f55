"""Prepare a corpus for pretraining: train (or reuse) a SentencePiece tokenizer, tokenise in
parallel with HF `datasets`, and write flat token arrays `train.bin`/`val.bin` (EOS between
documents) plus `meta.json`, in the layout of nanoGPT's `prepare.py` (memory-mapped numpy arrays).
The directory format lives in prepare_meta, the split in prepare_split, the pipeline in
prepare_build; this module checks the options, reuses or replaces `--out` and reports.

The output directory is built in a temporary sibling and renamed into place, so a failed run never
leaves a half-written directory nor damages an existing one.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.meta_file import META, token_dtype
from normlab.data.prepare_build import build
from normlab.data.prepare_inputs import FORMATS, HIDDEN, describe, expand_inputs, scan_source
from normlab.data.prepare_meta import (
    check_existing,
    check_out,
    data_fingerprint,
    read_meta,
    tokenizer_spec,
)
from normlab.data.prepare_split import assign_split, eos_after
from normlab.data.prepare_tmp import OWNER, make_tmp, remove_stale, stop_signals_unwind
from normlab.data.tokenizer import MODEL_TYPES
from normlab.data.tokenizer_select import resolve_tokenizer

CHUNK_LINES = 128  # lines per document for .txt inputs (the split unit)
# re-exported: the loader, preflight and reports read prepared directories through this module
__all__ = ["assign_split", "eos_after", "prepare", "read_meta", "token_dtype"]


def _finalize(tmp: Path, out: Path) -> None:
    """Move the finished temp dir into place; an existing `out` is swapped out, then removed."""
    shutil.rmtree(tmp / ".cache", ignore_errors=True)
    (tmp / OWNER).unlink(missing_ok=True)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _validate(
    inputs: list[str] | None, dataset_name: str | None, vocab_size: int, model_type: str,
    val_fraction: float, chunk_lines: int, num_proc: int, batch_mb: float,
) -> None:  # fmt: skip
    if inputs and dataset_name:
        raise DataError("give either input files or --dataset, not both")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if model_type not in MODEL_TYPES:
        raise DataError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if vocab_size < 300:  # checked given a tokenizer too: the defaults pass, a typo is caught
        raise DataError(f"vocab_size must be >= 300 (256 byte pieces + specials), got {vocab_size}")
    if chunk_lines < 1:
        raise DataError(f"chunk_lines must be >= 1, got {chunk_lines}")
    if num_proc < 1:
        raise DataError(f"num_proc must be >= 1, got {num_proc}")
    if not 0 < batch_mb <= 1024:
        raise DataError(f"batch_mb must be in (0, 1024], got {batch_mb}")


def scan_inputs(
    inputs: list[str] | None, dataset_name: str | None, dataset_split: str,
    settings: dict[str, Any], skip_undecodable: bool,
) -> tuple[list[dict[str, Any]], np.ndarray]:  # fmt: skip
    """Every source described and scanned once (prepare_inputs), with the UTF-8 bytes of each
    document; says on stderr what it leaves out (files, undecodable lines, rows)."""
    if dataset_name:
        plan = [{"dataset": dataset_name, "split": dataset_split}]
    else:
        if not inputs:
            from normlab.data.corpus import bundled_corpus_path

            inputs = [str(bundled_corpus_path())]
        files, skipped = expand_inputs(inputs)
        _report_skipped(skipped)
        plan = [describe(f) for f in files]
    scanned = [scan_source(src, settings, skip_undecodable) for src in plan]
    srcs = [desc for desc, _ in scanned]
    for src in srcs:
        if src.get("skipped_lines"):
            print(f"skipping {src['skipped_lines']:,} undecodable (not UTF-8) lines of "
                  f"{src['name']}", file=sys.stderr)  # fmt: skip
        if src.get("dropped_rows"):
            print(
                f"dropping {src['dropped_rows']:,} of {src['dropped_rows'] + src['documents']:,} "
                f"rows of {src['name']}: no string under --text-field "
                f"{settings['text_field']!r}",
                file=sys.stderr,
            )
    return srcs, np.concatenate([sizes for _, sizes in scanned])


def _report_skipped(skipped: list[Path]) -> None:
    hidden = sum(str(f) == HIDDEN for f in skipped)
    other = [f for f in skipped if str(f) != HIDDEN]
    if other:
        names = ", ".join(str(f) for f in other[:10]) + (" ..." * (len(other) > 10))
        print(
            f"skipping {len(other)} file(s) of types prepare does not read "
            f"(it reads {', '.join(FORMATS)}): {names}",
            file=sys.stderr,
        )
    if hidden:
        print(f"skipping {hidden} hidden file(s) (a name starting with '.')", file=sys.stderr)


def _check_val_split(srcs: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """A split by document needs two documents: refuse an input that gives one."""
    n_docs = sum(s["documents"] for s in srcs)
    if n_docs == 0:
        raise DataError("the inputs contain no documents")
    if settings["val_fraction"] > 0 and n_docs < 2:
        raise DataError(
            f"the inputs give {n_docs} document (a .txt document is a chunk of --chunk-lines "
            f"{settings['chunk_lines']} lines), so no validation split can be held out; "
            "give more documents or lines, lower --chunk-lines, or pass --val-fraction 0"
        )


def prepare(
    inputs: list[str] | None,
    out_dir: str | Path,
    *,
    vocab_size: int = 4096,
    model_type: str = "bpe",
    tokenizer: str | None = None,
    token_names: dict[str, str] | None = None,
    val_fraction: float = 0.005,
    text_field: str = "text",
    num_proc: int = 2,
    batch_mb: float = 1.0,
    seed: int = 0,
    dataset_name: str | None = None,
    dataset_split: str = "train",
    chunk_lines: int = CHUNK_LINES,
    overwrite: bool = False,
    skip_undecodable: bool = False,
) -> dict[str, Any]:
    """Tokenise `inputs` (local .txt/.md/.jsonl/.json/.parquet; None: the bundled corpus) or the
    Hub dataset `dataset_name` into `out_dir`; returns meta.json's content. `tokenizer`: a
    SentencePiece model, a tokenizer.json or a transformers tokenizer folder (token_names:
    bos/eos/pad token strings for it); None trains a SentencePiece model. Idempotent: a
    directory already prepared from the same inputs, split settings and tokenizer is reused."""
    _validate(inputs, dataset_name, vocab_size, model_type, val_fraction, chunk_lines, num_proc,
              batch_mb)  # fmt: skip
    out = Path(out_dir).expanduser().resolve()
    check_out(out)  # before reading any input: a directory that is not ours is refused at once
    given = resolve_tokenizer(tokenizer, token_names) if tokenizer else None
    settings = {
        "val_fraction": val_fraction,
        "seed": seed,
        "text_field": text_field,
        "chunk_lines": chunk_lines,
    }
    t0 = time.perf_counter()
    srcs, sizes = scan_inputs(inputs, dataset_name, dataset_split, settings, skip_undecodable)
    scan_s = time.perf_counter() - t0
    _check_val_split(srcs, settings)
    spec = None if given else tokenizer_spec(vocab_size, model_type)
    fingerprint = data_fingerprint(srcs, settings)
    existing = check_existing(out, fingerprint, given, spec, overwrite)
    for line in remove_stale(out):  # the temporary folders of stopped or killed preparations
        print(line, file=sys.stderr)
    if existing is not None:
        print(f"reusing {out}: already prepared with the same inputs and tokenizer")
        return existing
    with stop_signals_unwind():  # SIGTERM/SIGHUP: the temporary folder is removed, then exit
        meta = _build_into(out, srcs, sizes, given, spec, settings, num_proc, batch_mb, scan_s,
                           fingerprint)  # fmt: skip
    _report(meta, out, val_fraction, num_proc)
    return meta


def _build_into(
    out: Path, srcs: list[dict], sizes: Any, given: Any, spec: dict | None,
    settings: dict[str, Any], num_proc: int, batch_mb: float, scan_s: float, fingerprint: str,
) -> dict[str, Any]:  # fmt: skip
    """Build in a temporary sibling (prepare_tmp) and rename it to `out`; nothing is left behind
    on an error, Ctrl-C or a stop signal."""
    val_fraction = settings["val_fraction"]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_tmp(out)
    except OSError as exc:
        raise DataError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    try:
        meta = build(srcs, sizes, tmp, given, spec, settings, num_proc, batch_mb)
        if val_fraction > 0 and meta["tokens"]["val"] == 0:
            raise DataError(
                f"the {meta['documents']['val']} validation documents hold no tokens; give "
                "more text or a larger --val-fraction"
            )
        meta["fingerprint"] = fingerprint
        t = meta["timings_s"]
        meta["timings_s"] = {"scan": round(scan_s, 2), **t, "total": round(t["total"] + scan_s, 2)}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        _finalize(tmp, out)
    except OSError as exc:  # a full disk or a file that vanished: one line, nothing left behind
        shutil.rmtree(tmp, ignore_errors=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "no space left on device while writing" if full else exc.strerror or "error on"
        raise DataError(f"{what} {exc.filename or tmp}; {out} is unchanged") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _report(meta: dict[str, Any], out: Path, val_fraction: float, num_proc: int) -> None:
    n, t = meta["tokens"], meta["timings_s"]
    rate = (n["train"] + n["val"]) / max(t["tokenize"], 1e-9)
    print(
        f"prepared {out}: {n['train']:,} train + {n['val']:,} val tokens, vocab "
        f"{meta['vocab_size']} ({meta['dtype']}) in {t['total']} s ({rate:,.0f} tokens/s "
        f"tokenizing with {num_proc} process{'es' * (num_proc > 1)})"
    )
    _warn_small_val(n, val_fraction)
    print(f"train on it: normlab train pre data.dataset={shlex.quote(str(out))}")


def _warn_small_val(tokens: dict[str, int], asked: float) -> None:
    """The split is by document: few documents give a smaller (or no) validation split."""
    total = tokens["train"] + tokens["val"]
    got = tokens["val"] / total if total else 0.0
    if tokens["val"] == 0:
        print(
            "warning: the validation split is empty; `normlab train` evaluates on it, so "
            "prepare with --val-fraction > 0 to train on this directory",
            file=sys.stderr,
        )
    elif asked > 0 and got < 0.5 * asked:
        print(
            f"warning: the validation split holds {tokens['val']:,} tokens ({got:.2%}), less than "
            f"the {asked:.2%} asked: the split is by document (a .txt chunk of --chunk-lines "
            "lines); give more documents or a larger --val-fraction",
            file=sys.stderr,
        )
