"""`prepare --tokenizer` with tokenizers nobody tuned for normlab, built here with the `tokenizers`
library (nothing downloaded): byte-level BPE with only an end-of-text token (GPT-2 style, no BOS),
a Llama-style unigram with <s>/</s>/<pad>, a WordPiece whose end token must be named, a 70,000-word
vocabulary (uint32 token arrays) and a transformers tokenizer folder whose EOS only its config
names. The token arrays are checked against the tokenizer's own encode of each document plus EOS;
the HF files `export` writes encode token for token like the original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from normlab.data import DataError
from normlab.data.corpus import bundled_corpus_path
from normlab.data.prepare import assign_split, prepare
from normlab.data.tokenizer_select import resolve_tokenizer
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

CHUNK, LINES = 16, 1200
PROBES = [
    "  The quick brown fox, 1234 jumps\tover\n\nthe lazy dog.  \n",
    "Caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600 end",
    "a <|endoftext|> b </s> c [SEP] <pad>",
]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return bundled_corpus_path().read_text().splitlines(keepends=True)[:LINES]


def _bytelevel_bpe(lines: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def _unigram(lines: list[str]) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=500, special_tokens=["<unk>", "<s>", "</s>", "<pad>"], unk_token="<unk>"
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def _wordpiece(lines: list[str]) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=600, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def _large_vocab() -> Tokenizer:
    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000, "<|endoftext|>": 70_001}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.fixture(scope="module")
def made(lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    out = {}
    for name, tok in (
        ("bytelevel", _bytelevel_bpe(lines)),
        ("unigram", _unigram(lines)),
        ("wordpiece", _wordpiece(lines)),
        ("large", _large_vocab()),
    ):
        out[name] = root / f"{name}.json"
        tok.save(str(out[name]))
    return out


@pytest.fixture(scope="module")
def corpus(lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("corpus") / "text.txt"
    src.write_text("".join(lines))
    return src


def _bins(d: Path) -> dict[str, list[int]]:
    meta = json.loads((d / "meta.json").read_text())
    return {s: np.fromfile(d / f"{s}.bin", dtype=meta["dtype"]).tolist() for s in ("train", "val")}


def _expected(tok: Tokenizer, docs: list[str], eos: int, contig: bool) -> dict[str, list[int]]:
    """The reference: each document's own encode (no special tokens) + EOS at every break."""
    is_val = assign_split(len(docs), 0.1, seed=0)
    want: dict[str, list[int]] = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        cont = contig and i + 1 < len(docs) and is_val[i + 1] == is_val[i]
        ids = tok.encode(doc, add_special_tokens=False).ids
        want["val" if is_val[i] else "train"] += ids + ([] if cont else [eos])
    return want


KW = {"val_fraction": 0.1, "chunk_lines": CHUNK, "num_proc": 1}


@pytest.mark.parametrize(
    ("name", "names", "special"),
    [
        ("bytelevel", {}, {"bos": None, "eos": "<|endoftext|>", "pad": None}),
        ("unigram", {}, {"bos": "<s>", "eos": "</s>", "pad": "<pad>"}),
        ("wordpiece", {"eos": "[SEP]"}, {"bos": None, "eos": "[SEP]", "pad": "[PAD]"}),
    ],
)
def test_hf_tokenizer_json_bins_match_its_encode(
    made: dict[str, Path], corpus: Path, lines: list[str], tmp_path: Path, name: str,
    names: dict[str, str], special: dict[str, str | None],
) -> None:  # fmt: skip
    tok = Tokenizer.from_file(str(made[name]))
    out = tmp_path / "out"
    meta = prepare([str(corpus)], out, tokenizer=str(made[name]), token_names=names, **KW)
    docs = ["".join(lines[i : i + CHUNK]) for i in range(0, len(lines), CHUNK)]
    eos = tok.token_to_id(special["eos"])
    assert _bins(out) == _expected(tok, docs, eos, contig=True)
    for key, token in special.items():
        assert meta[f"{key}_id"] == (None if token is None else tok.token_to_id(token)), key
    assert meta["vocab_size"] == tok.get_vocab_size() and meta["dtype"] == "uint16"
    assert meta["tokenizer"]["kind"] == "hf" and (out / "tokenizer.json").is_file()
    assert Tokenizer.from_file(str(out / "tokenizer.json")).to_str() == tok.to_str()


def test_no_end_token_is_refused_naming_the_fix(made: dict[str, Path], corpus: Path) -> None:
    with pytest.raises(DataError, match=r"no end-of-text token .*\[SEP\].*--eos-token"):
        prepare([str(corpus)], corpus.parent / "x", tokenizer=str(made["wordpiece"]), **KW)
    with pytest.raises(DataError, match="--eos-token 'nope' is not a token"):
        resolve_tokenizer(made["wordpiece"], {"eos": "nope"})
    assert not (corpus.parent / "x").exists()


def test_large_vocab_needs_uint32_and_keeps_ids(made: dict[str, Path], tmp_path: Path) -> None:
    rows = [" ".join(f"w{65_530 + (i * 7 + j) % 4_470}" for j in range(50)) for i in range(60)]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    out = tmp_path / "out"
    meta = prepare([str(src)], out, tokenizer=str(made["large"]), num_proc=2, val_fraction=0.1)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_002
    tok = Tokenizer.from_file(str(made["large"]))
    assert _bins(out) == _expected(tok, rows, 70_001, contig=False)
    assert max(_bins(out)["train"]) > 65_535


def test_tokenizer_folder_gives_its_own_special_tokens(
    made: dict[str, Path], corpus: Path, tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "folder"
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(made["wordpiece"]), eos_token="[SEP]", bos_token="[CLS]",
        pad_token="[PAD]", unk_token="[UNK]",
    ).save_pretrained(str(folder))  # fmt: skip
    meta = prepare([str(corpus)], tmp_path / "out", tokenizer=str(folder), **KW)
    tok = Tokenizer.from_file(str(made["wordpiece"]))
    ids = {k: tok.token_to_id(t) for k, t in (("bos", "[CLS]"), ("eos", "[SEP]"), ("pad", "[PAD]"))}
    assert {k: meta[f"{k}_id"] for k in ids} == ids
    # the same folder again: the same preparation, reused
    again = prepare([str(corpus)], tmp_path / "out", tokenizer=str(folder), **KW)
    assert again == meta


@pytest.mark.parametrize("name", ["bytelevel", "unigram", "wordpiece", "large"])
def test_exported_hf_files_encode_like_the_original(
    made: dict[str, Path], lines: list[str], tmp_path: Path, name: str
) -> None:
    transformers = pytest.importorskip("transformers")
    from normlab.data.hf_tokenizer import save_hf_json_tokenizer

    names = {"eos": "[SEP]"} if name == "wordpiece" else {}
    info = resolve_tokenizer(made[name], names)
    ids = save_hf_json_tokenizer(info, tmp_path, model_max_length=64)
    again = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = Tokenizer.from_file(str(made[name]))
    texts = [*PROBES, *lines[900:1000], "".join(lines[1000:1040]), "w70000 w3 w65536 x"]
    for text in texts:
        for special in (False, True):
            want = tok.encode(text, add_special_tokens=special).ids
            assert again(text, add_special_tokens=special)["input_ids"] == want, repr(text)
    assert ids == info.special
    assert again.eos_token_id == info.special["eos"] and again.model_max_length == 64
    assert again.bos_token_id == info.special["bos"]


def test_export_of_a_run_ships_its_hf_tokenizer(
    made: dict[str, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prepare with the byte-level BPE, train 2 steps, export: the exported folder's tokenizer is
    the prepared one (same ids as the original on the probes) and the HF config carries its
    special ids (eos <|endoftext|>, no bos, no pad)."""
    transformers = pytest.importorskip("transformers")
    from normlab.launch.cli import main
    from normlab.launch.config import load_config
    from normlab.launch.config.loader import find_recipe
    from normlab.launch.training.trainer import Trainer

    from tests.conftest import tiny_overrides

    data = tmp_path / "data"
    meta = prepare([str(corpus)], data, tokenizer=str(made["bytelevel"]), **KW)
    over = tiny_overrides(data, tmp_path / "run", training__steps=2, checkpoint__every=2)
    over += ["training.eval_every=0", "instruments={}"]
    over += [f"model.vocab_size={meta['vocab_size']}", f"data.vocab_size={meta['vocab_size']}"]
    assert Trainer(load_config(find_recipe("pre"), over)).run() == 0
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run"), "--out", str(out)]) == 0, capsys.readouterr()
    tok = Tokenizer.from_file(str(made["bytelevel"]))
    again = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in PROBES:
        assert again(text, add_special_tokens=False)["input_ids"] == tok.encode(text).ids
    config = json.loads((out / "config.json").read_text())
    eos = tok.token_to_id("<|endoftext|>")
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        None,
        eos,
        None,
    )
    assert json.loads((out / "generation_config.json").read_text())["pad_token_id"] == eos
