"""What `prepare --tokenizer` checks of a tokenizer before anything is written: each problem is
one DataError naming it, instead of an encoder exception in a worker half-way through a corpus.

The class of degenerate tokenizers: an empty vocabulary; two tokens sharing one id (an end-of-text
id that is also an ordinary token's id among them: the encoder then fails on its own
re-serialised copy, or writes one id for two tokens); ids beyond what the token arrays hold
(uint32) or so sparse that the embedding would be mostly holes; no end-of-text token (prepare puts
one after each document), or one that is the unknown token; and a tokenizer that cannot encode a
probe text (the copy prepare stores is the one checked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.data.errors import DataError

MAX_IDS = 1 << 32  # uint32 token arrays (data.prepare_meta.token_dtype)
# ids may leave a few holes (reserved ranges); beyond this the file is damaged or mis-numbered
SPARSE_SLACK, SPARSE_FACTOR = 1024, 2

PROBE_TOKENS = 64  # ordinary tokens decoded into the probe text: text the tokenizer can hold


def check_ids(backend: Any, path: Path) -> int:
    """The vocabulary size (largest id + 1) of a `tokenizers.Tokenizer` loaded from `path`, after
    checking that it has tokens, that no two tokens share an id (as loaded, and as the file
    declares its added tokens: tokenizers quietly moves an added token whose declared id an
    ordinary token holds) and that the ids are dense enough to embed."""
    _check_declared(backend, path)
    owner: dict[int, str] = {}
    for token, i in sorted(backend.get_vocab(with_added_tokens=False).items(), key=lambda t: t[1]):
        if i in owner:
            raise DataError(_clash(path, i, owner[i], token))
        owner[i] = token
    for i, added in sorted(backend.get_added_tokens_decoder().items()):
        if owner.setdefault(i, added.content) != added.content:
            raise DataError(_clash(path, i, added.content, owner[i]))
    if not owner:
        raise DataError(f"{path} has an empty vocabulary (no tokens): not a usable tokenizer")
    size = max(owner) + 1
    if size > MAX_IDS:
        raise DataError(
            f"{path} has ids up to {size - 1:,}, beyond the uint32 token arrays (< {MAX_IDS:,})"
        )
    if size > SPARSE_FACTOR * len(owner) + SPARSE_SLACK:
        raise DataError(
            f"{path} has {len(owner):,} tokens but ids up to {size - 1:,}: the model would "
            f"embed {size:,} rows, mostly holes; renumber the tokenizer's ids"
        )
    return size


def _check_declared(backend: Any, path: Path) -> None:
    from normlab.launch.json_file import read_json

    data = read_json(path, "tokenizer file", DataError)  # tokenizers parsed it: this is JSON
    declared = (data.get("added_tokens") if isinstance(data, dict) else None) or []
    if not isinstance(declared, list):
        raise DataError(f"{path}: added_tokens is a {type(declared).__name__}, expected a list")
    for entry in declared:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
            continue
        content, i = entry.get("content"), entry["id"]
        loaded = backend.token_to_id(content) if isinstance(content, str) else i
        if loaded != i:
            other = backend.id_to_token(i)
            raise DataError(
                _clash(path, i, content, other)
                if other
                else (f"{path} declares id {i} for {content!r}; tokenizers loads it as id {loaded}")
            )


def _clash(path: Path, i: int, a: str | None, b: str) -> str:
    return (
        f"{path} gives id {i} to two tokens, {a!r} and {b!r} (each token needs its own id: an "
        "added/special token's id must not be an ordinary token's); fix the tokenizer.json"
    )


def check_end_token(special: dict[str, int | None], path: Path, hint: str) -> None:
    """The end-of-text token exists (`hint`: what the tokenizer has and how to name one) and is
    not the unknown token."""
    eos, unk = special.get("eos"), special.get("unk")
    if eos is None:
        raise DataError(
            f"{path} has no end-of-text token {hint} (prepare puts it after each document)"
        )
    if eos == unk:
        raise DataError(
            f"{path}: its end-of-text token is its unknown token (id {eos}); name the real one "
            "with --eos-token TOKEN"
        )


def check_encodes(content: bytes, special: dict[str, int | None], size: int, path: Path) -> None:
    """The tokenizer.json prepare stores (`content`) loads, encodes a probe text with ids in
    [0, size) and maps its end-of-text id back to a token. The probe is the decode of its first
    ordinary tokens, so a tokenizer made for a narrow alphabet (no unknown token) passes too."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(content.decode())
        added = set(tok.get_added_tokens_decoder())
        ordinary = sorted(set(tok.get_vocab(with_added_tokens=False).values()) - added)
        probe = tok.decode(ordinary[:PROBE_TOKENS], skip_special_tokens=True)
        ids = [i for e in tok.encode_batch_fast([probe], add_special_tokens=False) for i in e.ids]
    except Exception as exc:  # tokenizers raises bare Exceptions ("Token 68 out of vocabulary")
        raise DataError(f"{path} loads but cannot encode text: {_first_line(exc)}") from None
    bad = [i for i in ids if not 0 <= i < size]
    if bad:
        raise DataError(f"{path} encodes text into id {bad[0]}, outside its vocabulary [0, {size})")
    eos = special["eos"]
    if eos is not None and tok.id_to_token(eos) is None:
        raise DataError(f"{path}: its end-of-text id {eos} is no token of the tokenizer")


def encode_error(exc: BaseException, where: str) -> DataError:
    """A tokenizer's exception while encoding a corpus batch, as one line."""
    return DataError(f"the tokenizer cannot encode {where}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
