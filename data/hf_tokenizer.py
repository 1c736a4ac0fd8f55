"""HF tokenizers in and out of normlab: importing a tokenizer.json or a transformers tokenizer
folder for `prepare` (`hf_info`), and exporting the tokenizer a run trained on as HF files.

A bare tokenizer.json does not say which token ends a text: its special tokens are recognised by
the names model families use (EOS_NAMES, ...), or named with --eos-token/--bos-token/--pad-token;
a folder's tokenizer_config.json says it through AutoTokenizer. The exported tokenizer is that
same tokenizer.json with those special tokens, checked to encode the probe text identically.

A normlab SentencePiece model is exported as HF tokenizer files built by transformers itself.

transformers converts the `.model` file (`PreTrainedTokenizerFast.from_pretrained` on a folder
holding only tokenizer.model runs its SentencePiece converter, which follows the model's own
normaliser settings: no dummy prefix, whitespace kept, byte fallback). normlab documents carry no
BOS (prepare puts EOS between documents), so the HF tokenizer adds no special token either:
`AutoTokenizer(text).input_ids == SentencePieceProcessor.encode(text)`, checked on a probe text
before anything is written. transformers is imported lazily: it is the `hf` extra.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from normlab.data.errors import DataError
from normlab.data.tokenizer import SPECIALS, TokenizerInfo, load_tokenizer

# Special tokens by the names model families give them (GPT-2/Llama 3/T5/Llama/Gemma/BERT...).
NAMES = {
    "eos": ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|end|>"),
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>", "[BOS]"),
    "pad": ("<pad>", "<|pad|>", "[PAD]", "<|padding|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}

SPM_FILE = "tokenizer.model"


def hf_info(path: Path, names: dict[str, str]) -> TokenizerInfo:
    """A tokenizer.json (tokenizers) or a tokenizer folder (transformers.AutoTokenizer) as the
    tokenizer.json prepare stores, with its special-token ids."""
    from tokenizers import Tokenizer

    if path.is_dir():
        backend, given = _from_folder(path)
    else:
        try:
            backend, given = Tokenizer.from_file(str(path)), {}
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise DataError(f"{path} is not a tokenizers tokenizer.json: {exc}") from None
    vocab = backend.get_vocab(with_added_tokens=True)
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    special: dict[str, int | None] = {}
    for name in SPECIALS:
        token = names.get(name)
        if token:
            if token not in vocab:
                raise DataError(f"--{name}-token {token!r} is not a token of {path}")
            special[name] = vocab[token]
        elif name in given:
            special[name] = given[name]
        else:
            special[name] = _by_name(added, vocab, name) if not path.is_dir() else None
    if special["eos"] is None:
        listed = ", ".join(t.content for t in backend.get_added_tokens_decoder().values())
        raise DataError(
            f"{path} has no end-of-text token that normlab recognises (special tokens: "
            f"{listed or 'none'}); name it with --eos-token TOKEN (prepare puts it after each "
            "document)"
        )
    content = backend.to_str().encode()
    size = max(vocab.values()) + 1
    return TokenizerInfo("hf", path, size, special, hashlib.sha256(content).hexdigest(), content)


def _by_name(added: dict[str, int], vocab: dict[str, int], name: str) -> int | None:
    """The id of the first NAMES[name] token the tokenizer has (special tokens first)."""
    for table in (added, vocab):
        for token in NAMES[name]:
            if token in table:
                return table[token]
    return None


def _from_folder(path: Path) -> tuple[Any, dict[str, int | None]]:
    from normlab.launch.extras import require

    require("transformers", f"prepare --tokenizer {path} (a tokenizer folder)")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # OSError, ValueError, KeyError... by what the folder lacks
        raise DataError(f"transformers cannot load a tokenizer from {path}: {exc}") from None
    if not getattr(tok, "is_fast", False):
        raise DataError(f"{path} holds a slow (Python) tokenizer; normlab needs a fast one")
    given = {name: getattr(tok, f"{name}_token_id", None) for name in SPECIALS}
    return tok.backend_tokenizer, {k: v for k, v in given.items() if v is not None}


# Text that exercises what the normaliser could get wrong: leading, repeated and trailing spaces,
# newlines and tabs, digits (split one by one), accents, CJK and an emoji (byte fallback).
PROBE = (
    "  The quick brown fox, 1234 jumps\tover\n\nthe lazy dog.  \n"
    "Caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600 end"
)


def special_tokens(spm_path: Path) -> dict[str, int | None]:
    """bos/eos/unk/pad ids of the SentencePiece model (None where it has no such piece)."""
    sp = load_tokenizer(spm_path)
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id()}
    return {name: (i if 0 <= i < sp.vocab_size() else None) for name, i in ids.items()}


def hf_tokenizer(spm_path: Path, model_max_length: int | None = None) -> Any:
    """A transformers fast tokenizer converted from `spm_path`, verified against SentencePiece.

    pad: normlab has no pad piece; the tokenizer pads with EOS (attention masks hide it), the
    common choice for decoder-only models."""
    from transformers import PreTrainedTokenizerFast

    sp = load_tokenizer(spm_path)
    ids = special_tokens(spm_path)
    piece = {name: sp.id_to_piece(i) for name, i in ids.items() if i is not None}
    tokens = {f"{name}_token": p for name, p in piece.items()}
    tokens.setdefault("pad_token", piece.get("eos"))
    limit = {"model_max_length": model_max_length} if model_max_length else {}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(spm_path, Path(tmp) / SPM_FILE)
        try:
            converted = PreTrainedTokenizerFast.from_pretrained(tmp).backend_tokenizer
        except (OSError, ValueError, TypeError, ImportError) as exc:
            raise DataError(
                f"this transformers cannot convert {spm_path} ({exc}); pip install -U "
                "'normlab[hf]', or export with --no-hf"
            ) from None
    # split_special_tokens: a literal "</s>" in text is text, as SentencePiece (and so training)
    # saw it, not the EOS id. (Exact for BPE; a converted unigram model still matches the
    # control pieces' names inside its own search: tokenizers has no notion of control pieces.)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=converted,
        **tokens,
        **limit,
        split_special_tokens=True,
    )
    check_same_tokens(tok, sp, spm_path)
    return tok


def check_same_tokens(tok: Any, sp: Any, spm_path: Path) -> None:
    """DataError unless `tok` encodes and decodes the probe exactly like SentencePiece."""
    want = sp.encode(PROBE)
    got = tok(PROBE, add_special_tokens=True)["input_ids"]
    if got != want:
        pairs = zip(got + [-1], want + [-1], strict=False)
        at = next(i for i, (a, b) in enumerate(pairs) if a != b)
        raise DataError(
            f"transformers converts {spm_path} into a tokenizer that encodes differently "
            f"(from token {at}: {got[at : at + 4]} vs SentencePiece {want[at : at + 4]}); "
            "export with --no-hf"
        )
    if tok.decode(want) != sp.decode(want):
        raise DataError(f"transformers' tokenizer for {spm_path} decodes differently; --no-hf")


def save_hf_tokenizer(
    spm_path: Path, out: Path, model_max_length: int | None = None
) -> dict[str, int | None]:
    """Write tokenizer.model, tokenizer.json, tokenizer_config.json and special_tokens_map.json
    into `out`; return the special-token ids (for the model config)."""
    tok = hf_tokenizer(spm_path, model_max_length)
    tok.save_pretrained(str(out))
    shutil.copyfile(spm_path, out / SPM_FILE)
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    mapping = {n: str(getattr(tok, n)) for n in names if getattr(tok, n) is not None}
    (out / "special_tokens_map.json").write_text(json.dumps(mapping, indent=2) + "\n")
    return special_tokens(spm_path)


def save_hf_json_tokenizer(
    info: TokenizerInfo, out: Path, model_max_length: int | None = None
) -> dict[str, int | None]:
    """Write a prepared directory's tokenizer.json as HF tokenizer files (tokenizer.json,
    tokenizer_config.json, special_tokens_map.json) with its special tokens; the written files
    must encode the probe like the original. Returns the special-token ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(info.content.decode()) if info.content else None
    backend = backend or Tokenizer.from_file(str(info.path))
    names = {f"{k}_token": backend.id_to_token(i) for k, i in info.special.items() if i is not None}
    limit = {"model_max_length": model_max_length} if model_max_length else {}
    PreTrainedTokenizerFast(tokenizer_object=backend, **names, **limit).save_pretrained(str(out))
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    want = backend.encode(PROBE, add_special_tokens=False).ids
    got = again(PROBE, add_special_tokens=False)["input_ids"]
    if got != want:
        raise DataError(f"the exported tokenizer encodes differently from {info.path}; --no-hf")
    return dict(info.special)
