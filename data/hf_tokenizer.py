"""A normlab SentencePiece model as HF tokenizer files, built by transformers itself.

transformers converts the `.model` file (`PreTrainedTokenizerFast.from_pretrained` on a folder
holding only tokenizer.model runs its SentencePiece converter, which follows the model's own
normaliser settings: no dummy prefix, whitespace kept, byte fallback). normlab documents carry no
BOS (prepare puts EOS between documents), so the HF tokenizer adds no special token either:
`AutoTokenizer(text).input_ids == SentencePieceProcessor.encode(text)`, checked on a probe text
before anything is written. transformers is imported lazily: it is the `hf` extra.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from normlab.data.errors import DataError
from normlab.data.tokenizer import load_tokenizer

SPM_FILE = "tokenizer.model"
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
