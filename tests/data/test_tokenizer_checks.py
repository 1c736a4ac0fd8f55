"""`prepare --tokenizer` on the documented install, and degenerate tokenizers (issue 30, item 2).

A tokenizer.json, a SentencePiece model and a tokenizer folder prepare with nothing imported that
`pip install normlab` does not install (transformers blocked; every imported distribution is in
the closure of pyproject's dependencies). Each degenerate tokenizer is one line, exit 2 from the
CLI, nothing written: an end-of-text id that is also an ordinary token's id (in the vocabulary,
or declared for an added token), an empty vocabulary, ids far sparser than the tokens, no
end-of-text token (tokenizer.json and SentencePiece), an end-of-text token that is the unknown
token, a folder without tokenizer.json (with a .model in it, and without), a folder whose config
names a token the tokenizer lacks, a malformed file, and a tokenizer that fails on the corpus."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from normlab.data import DataError
from normlab.data.tokenizer_select import resolve_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.conftest import REPO

TEXT = ["hello world, the quick brown fox jumps over the lazy dog\n"] * 40


def _bpe(specials: list[str]) -> dict:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    return json.loads(tok.to_str())


def _eos_on_ordinary_id(d: dict) -> dict:
    """The end-of-text token moved onto id 68, which the vocabulary gives to an ordinary token."""
    d["model"]["vocab"]["<|endoftext|>"] = 68
    d["added_tokens"][0]["id"] = 68
    return d


def _eos_declared_on_ordinary_id(d: dict) -> dict:
    """Only in added_tokens, declared at id 68 (tokenizers would quietly move it to the end)."""
    vocab = d["model"]["vocab"]
    del vocab["<|endoftext|>"]
    d["model"]["vocab"] = {t: i - 1 for t, i in vocab.items()}
    d["added_tokens"][0]["id"] = 68
    return d


def _empty(d: dict) -> dict:
    d["model"]["vocab"], d["model"]["merges"], d["added_tokens"] = {}, [], []
    return d


def _sparse(d: dict) -> dict:
    d["added_tokens"][0]["id"] = 5_000_000
    d["model"]["vocab"]["<|endoftext|>"] = 5_000_000
    return d


def _wordlevel_eos_is_unk() -> dict:
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return json.loads(tok.to_str())


DEGENERATE = {
    "eos_on_ordinary_id": (lambda: _eos_on_ordinary_id(_bpe(["<|endoftext|>"])), {},
                           r"gives id 68 to two tokens, .*<\|endoftext\|>"),
    "eos_declared_on_ordinary_id": (lambda: _eos_declared_on_ordinary_id(_bpe(["<|endoftext|>"])),
                                    {}, r"gives id 68 to two tokens, '<\|endoftext\|>' and"),
    "empty": (lambda: _empty(_bpe(["<|endoftext|>"])), {}, "empty vocabulary"),
    "sparse": (lambda: _sparse(_bpe(["<|endoftext|>"])), {}, r"ids up to 5,000,000.*holes"),
    "no_eos": (lambda: _bpe([]), {}, r"no end-of-text token that normlab recognises .*--eos-token"),
    "eos_is_unk": (_wordlevel_eos_is_unk, {"eos": "<unk>"}, "end-of-text token is its unknown"),
}  # fmt: skip


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    src = tmp_path / "corpus.txt"
    src.write_text("".join(TEXT * 5))
    return src


def _prepare_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from normlab.launch.cli import main

    rc = main(["prepare", *args])
    out = capsys.readouterr()
    return rc, (out.out + out.err).strip()


@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_degenerate_tokenizer_json_is_one_line(
    case: str, tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, names, message = DEGENERATE[case]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(make()))
    with pytest.raises(DataError, match=message):
        resolve_tokenizer(path, names)
    out = tmp_path / "out"
    flags = [f"--{k}-token={v}" for k, v in names.items()]
    args = [str(corpus), "--out", str(out), "--tokenizer", str(path), *flags]
    rc, text = _prepare_cli(args, capsys)
    assert rc == 2 and len(text.splitlines()) == 1 and re.search(message, text), text
    assert not out.exists()


def test_sentencepiece_without_eos_is_one_line(tmp_path: Path, corpus: Path) -> None:
    import sentencepiece as spm

    model = tmp_path / "noeos.model"
    with open(model, "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(TEXT * 5), model_writer=f, vocab_size=30, eos_id=-1,
            minloglevel=2, byte_fallback=False,
        )  # fmt: skip
    with pytest.raises(DataError, match=r"noeos.model has no end-of-text token \(its eos_id is -1"):
        resolve_tokenizer(model)


def test_folder_without_tokenizer_json_is_one_line(tmp_path: Path, corpus: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    with pytest.raises(DataError, match=r"no tokenizer.json \(it holds: tokenizer_config.json\)"):
        resolve_tokenizer(folder)
    (folder / "tokenizer.model").write_bytes(b"x")
    with pytest.raises(DataError, match=r"its tokenizer.model is a SentencePiece model: --tok"):
        resolve_tokenizer(folder)


def test_folder_config_naming_a_missing_token(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(_bpe(["<|endoftext|>"])))
    (folder / "tokenizer_config.json").write_text('{"eos_token": {"content": "</s>"}}')
    with pytest.raises(DataError, match=r"tokenizer_config.json eos_token '</s>' is not a token"):
        resolve_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(DataError, match="tokenizer_config.json is not valid JSON"):
        resolve_tokenizer(folder)


def test_malformed_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(DataError, match=r"is not a tokenizers tokenizer.json: ") as err:
        resolve_tokenizer(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_tokenizer_failing_on_the_corpus_is_one_line(
    tmp_path: Path, corpus: Path, num_proc: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A word-level tokenizer with no unknown token passes the checks (it encodes its own words)
    and then meets a word it lacks: one line naming the failure, not a worker traceback."""
    vocab = {"hello": 0, "world,": 1, "</s>": 2}
    tok = Tokenizer(models.WordLevel(vocab))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    out = tmp_path / "out"
    args = [str(corpus), "--out", str(out), "--tokenizer", str(path), f"--num-proc={num_proc}"]
    rc, text = _prepare_cli(args, capsys)
    assert rc == 2 and len(text.splitlines()) == 1, text
    assert text.startswith("error: the tokenizer cannot encode a batch of"), text
    assert not out.exists()


# --- the documented install: `pip install normlab` brings everything prepare --tokenizer needs ---

PROBE = """
import json, sys
sys.modules["transformers"] = None  # not installed: the hf extra is for export only
from pathlib import Path
from normlab.data.prepare import prepare
out = {}
for name, tok in json.loads(sys.argv[1]).items():
    meta = prepare([sys.argv[2]], Path(sys.argv[3]) / name, tokenizer=tok, val_fraction=0.1,
                   chunk_lines=8, num_proc=1)
    out[name] = [meta["tokenizer"]["kind"], meta["eos_id"], meta["tokens"]["train"] > 0]
mods = {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
mods = sorted(mods - set(sys.stdlib_module_names))
print(json.dumps({"prepared": out, "modules": mods}))
"""


def _dependency_closure() -> set[str]:
    """Distributions `pip install normlab` installs: pyproject's dependencies and theirs."""
    from importlib import metadata

    from packaging.requirements import Requirement

    pending = [Requirement(r).name for r in tomllib.loads(
        (REPO / "pyproject.toml").read_text())["project"]["dependencies"]]  # fmt: skip
    seen: set[str] = set()
    while pending:
        name = pending.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for req in metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                pending.append(r.name)
    return seen


def test_tokenizers_prepare_on_the_documented_install(tmp_path: Path, corpus: Path) -> None:
    from importlib import metadata

    import sentencepiece as spm

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(_bpe(["<|endoftext|>", "<s>"])))
    (folder / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": {"content": "<|endoftext|>", "special": true}}'
    )
    (tmp_path / "tokenizer.json").write_text(json.dumps(_bpe(["<|endoftext|>"])))
    with open(tmp_path / "sp.model", "wb") as f:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(TEXT * 5),
            model_writer=f,
            vocab_size=32,
            minloglevel=2,
            model_type="char",
        )
    toks = {"json": str(tmp_path / "tokenizer.json"), "folder": str(folder),
            "spm": str(tmp_path / "sp.model")}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(toks), str(corpus), str(tmp_path / "out")],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.splitlines()[-1])
    bpe = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert got["prepared"]["folder"] == ["hf", bpe.token_to_id("<|endoftext|>"), True]
    assert got["prepared"]["json"][0] == "hf"
    assert got["prepared"]["spm"] == ["sentencepiece", 2, True]
    closure = _dependency_closure()
    assert "tokenizers" in closure and "transformers" not in closure
    dists = metadata.packages_distributions()
    # modules of an installed distribution (not normlab itself, nor runtime-made ones)
    outside = {
        m: dists[m] for m in got["modules"]
        if m in dists and m != "normlab"
        and not any(d.lower().replace("_", "-") in closure for d in dists[m])
    }  # fmt: skip
    assert not outside, f"prepare --tokenizer imports what `pip install normlab` lacks: {outside}"
