"""HF tokenizers in and out of normlab: importing a tokenizer.json or a transformers tokenizer
folder for `prepare` (`hf_info`), and exporting the tokenizer a run trained on as HF files.

A bare tokenizer.json does not say which token ends a text: its special tokens are recognised by
the names model families use (NAMES), or named with --eos-token/--bos-token/--pad-token; a
folder's tokenizer_config.json (or special_tokens_map.json) names them. Importing needs only
`tokenizers` (a dependency); data.tokenizer_checks refuses degenerate tokenizers in one line.
The exported tokenizer is that same tokenizer.json with those special tokens, checked to encode
the probe text identically.

A normlab SentencePiece model is exported as HF tokenizer files built by transformers itself.

transformers converts the `.model` file (`PreTrainedTokenizerFast.from_pretrained` on a folder
holding only tokenizer.model runs its SentencePiece converter, which follows the model's own
normaliser settings: no dummy prefix, whitespace kept, byte fallback). normlab documents carry no
BOS (prepare puts EOS between documents), so the HF tokenizer adds no special token either:
`AutoTokenizer(text).input_ids == SentencePieceProcessor.encode(text)`, checked on a probe text
before anything is written. transformers (export only) is imported lazily: it is the `hf` extra.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from normlab.data.errors import DataError
from normlab.data.tokenizer import HF_FILE, SPECIALS, TokenizerInfo, load_tokenizer
from normlab.data.tokenizer_checks import check_encodes, check_end_token, check_ids
from normlab.launch.json_file import read_json

# Special tokens by the names model families give them (GPT-2/Llama 3/T5/Llama/Gemma/BERT...).
NAMES = {
    "eos": ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|end|>"),
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|bos|>", "[BOS]"),
    "pad": ("<pad>", "<|pad|>", "[PAD]", "<|padding|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}

SPM_FILE = "tokenizer.model"


def hf_info(path: Path, names: dict[str, str]) -> TokenizerInfo:
    """A tokenizer.json, or a tokenizer folder holding one (its tokenizer_config.json and
    special_tokens_map.json name the special tokens), as the tokenizer.json prepare stores, with
    its special-token ids; data.tokenizer_checks refuses the degenerate ones in one line. Needs
    `tokenizers` only (a dependency), not transformers."""
    from tokenizers import Tokenizer

    file, given = _folder(path) if path.is_dir() else (path, {})
    try:
        backend = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise DataError(f"{file} is not a tokenizers tokenizer.json: {first}") from None
    size = check_ids(backend, file)
    vocab = backend.get_vocab(with_added_tokens=True)
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    special: dict[str, int | None] = {}
    for name in SPECIALS:
        token, where = given.get(name, (None, ""))
        if names.get(name):
            token, where = names[name], f"--{name}-token"
        if token:
            if token not in vocab:
                raise DataError(f"{where} {token!r} is not a token of {file}")
            special[name] = vocab[token]
        else:
            special[name] = _by_name(added, vocab, name)
    listed = ", ".join(t.content for t in backend.get_added_tokens_decoder().values())
    hint = (
        f"that normlab recognises (special tokens: {listed or 'none'}); name it with "
        "--eos-token TOKEN"
    )
    check_end_token(special, path, hint)
    content = backend.to_str().encode()
    check_encodes(content, special, size, file)
    return TokenizerInfo("hf", path, size, special, hashlib.sha256(content).hexdigest(), content)


def _by_name(added: dict[str, int], vocab: dict[str, int], name: str) -> int | None:
    """The id of the first NAMES[name] token the tokenizer has (special tokens first)."""
    for table in (added, vocab):
        for token in NAMES[name]:
            if token in table:
                return table[token]
    return None


def _folder(path: Path) -> tuple[Path, dict[str, tuple[str, str]]]:
    """A tokenizer folder's tokenizer.json and the special tokens its config files name
    ({name: (token, which file)}), tokenizer_config.json over special_tokens_map.json."""
    file = path / HF_FILE
    if not file.is_file():
        has = sorted(p.name for p in path.iterdir())[:6]
        spm = [p for p in path.glob("*.model")]
        hint = (
            f"its {spm[0].name} is a SentencePiece model: --tokenizer {spm[0]}"
            if spm
            else "write one with transformers: AutoTokenizer.from_pretrained(D).save_pretrained(D)"
        )
        raise DataError(
            f"tokenizer folder {path} has no tokenizer.json (it holds: "
            f"{', '.join(has) or 'nothing'}); {hint}"
        )
    given: dict[str, tuple[str, str]] = {}
    for conf in ("special_tokens_map.json", "tokenizer_config.json"):  # the later one wins
        f = path / conf
        if not f.is_file():
            continue
        data = read_json(f, "tokenizer settings", DataError)  # UTF-8, syntax, no key twice
        if not isinstance(data, dict):
            raise DataError(f"{f} is not a JSON object")
        for name in SPECIALS:
            token = _token_text(data.get(f"{name}_token"))
            if token:
                given[name] = (token, f"{f} {name}_token")
    return file, given


def _token_text(value: Any) -> str | None:
    """A special token as config files write it: a string, or {"content": ...} (AddedToken)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


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
