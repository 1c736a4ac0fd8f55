"""Data pipeline: bundled corpus, prepare (tokenizer, split, bins, idempotence) and the loader.

Uses a 3,000-line slice of the bundled corpus and a 512-piece tokenizer: the file runs in seconds.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from normlab.data import DataError
from normlab.data.cli import main as cli_main
from normlab.data.corpus import CORPUS_XZ, bundled_corpus_path
from normlab.data.loader import PackedLoader
from normlab.data.prepare import assign_split, eos_after, prepare, token_dtype

CHUNK = 32
SLICE_LINES = 3000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(cache))
    text = bundled_corpus_path().read_text()
    mp.undo()
    return text


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, corpus: str) -> tuple[Path, Path]:
    """(input .txt, prepared dir) for a slice of the corpus at vocab 512."""
    root = tmp_path_factory.mktemp("small")
    src = root / "slice.txt"
    src.write_text("".join(corpus.splitlines(keepends=True)[:SLICE_LINES]))
    out = root / "prepared"
    prepare([str(src)], out, vocab_size=512, val_fraction=0.05, num_proc=1, chunk_lines=CHUNK)
    return src, out


def _sp(d: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))


def _bins(d: Path) -> dict[str, np.ndarray]:
    meta = json.loads((d / "meta.json").read_text())
    return {s: np.fromfile(d / f"{s}.bin", dtype=meta["dtype"]) for s in ("train", "val")}


def test_bundled_corpus_decompresses_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    p = bundled_corpus_path()
    raw = p.read_bytes()
    assert raw == lzma.decompress(CORPUS_XZ.read_bytes())
    # The checksum recorded in PROVENANCE.md.
    assert hashlib.sha256(raw).hexdigest().startswith("f9a9c3bba5a0c7cb")
    assert b"gutenberg" not in raw.lower() and raw.startswith(b"ALL'S WELL THAT ENDS WELL")
    mtime = p.stat().st_mtime_ns
    assert bundled_corpus_path() == p and p.stat().st_mtime_ns == mtime
    assert [f.name for f in tmp_path.iterdir()] == [p.name]  # no temp file left behind


def test_tokenizer_round_trip(small: tuple[Path, Path], corpus: str) -> None:
    sp = _sp(small[1])
    assert sp.vocab_size() == 512
    tail = corpus[-200_000:]  # text the tokenizer never saw
    assert sp.decode(sp.encode(tail)) == tail
    odd = "naïve café — ✓\n\tindented  two spaces\n\n"  # non-ASCII goes through byte fallback
    assert sp.decode(sp.encode(odd)) == odd


def test_dtype_rule() -> None:
    assert token_dtype(512) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535 fit
    assert token_dtype(65537) == np.uint32


def test_split_rule_and_eos() -> None:
    a = assign_split(1000, 0.05, seed=0)
    assert a.sum() == 50 and (a == assign_split(1000, 0.05, seed=0)).all()
    assert not (a == assign_split(1000, 0.05, seed=1)).all()
    assert assign_split(10, 0.001, 0).sum() == 1 and assign_split(10, 0.0, 0).sum() == 0
    contig = np.array([True, True, True, False, False])
    is_val = np.array([False, True, False, False, True])
    # Row 0 continues into a val row: EOS; row 2 continues into row 3 in the same split: none.
    assert eos_after(contig, is_val).tolist() == [True, True, False, True, True]


def test_bins_match_reference(small: tuple[Path, Path]) -> None:
    """Rebuild train/val streams by hand: line chunks, encode, EOS at discontinuities."""
    src, out = small
    meta = json.loads((out / "meta.json").read_text())
    sp, bins = _sp(out), _bins(out)
    lines = src.read_text().splitlines(keepends=True)
    docs = ["".join(lines[i : i + CHUNK]) for i in range(0, len(lines), CHUNK)]
    is_val = assign_split(len(docs), 0.05, seed=0)
    expect: dict[str, list[int]] = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        split = "val" if is_val[i] else "train"
        continues = i + 1 < len(docs) and is_val[i + 1] == is_val[i]
        expect[split] += sp.encode(doc) + ([] if continues else [sp.eos_id()])
    for split in ("train", "val"):
        assert bins[split].tolist() == expect[split]
        assert meta["tokens"][split] == len(expect[split])
    assert meta["dtype"] == "uint16" and bins["train"].dtype == np.uint16
    assert meta["documents"] == {"train": int((~is_val).sum()), "val": int(is_val.sum())}
    assert meta["eos_id"] == sp.eos_id() and meta["vocab_size"] == 512
    with open(out / "tokenizer.model", "rb") as f:
        assert meta["tokenizer"]["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert not (out / ".cache").exists()


def test_rerun_is_idempotent(small: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    src, out = small
    before = {f.name: f.stat().st_mtime_ns for f in out.iterdir()}
    kw = {"vocab_size": 512, "val_fraction": 0.05, "num_proc": 1, "chunk_lines": CHUNK}
    meta = prepare([str(src)], out, **kw)
    assert "reusing" in capsys.readouterr().out
    assert {f.name: f.stat().st_mtime_ns for f in out.iterdir()} == before
    # The same tokenizer given as a file is the same preparation too.
    prepare([str(src)], out, tokenizer=str(out / "tokenizer.model"), **kw)
    assert json.loads((out / "meta.json").read_text()) == meta


def test_different_tokenizer_refused(small: tuple[Path, Path], tmp_path: Path) -> None:
    src, out = small
    other = tmp_path / "other"
    prepare([str(src)], other, vocab_size=400, val_fraction=0.05, num_proc=1, chunk_lines=CHUNK)
    before = {f.name: f.stat().st_mtime_ns for f in out.iterdir()}
    kw = {"val_fraction": 0.05, "num_proc": 1, "chunk_lines": CHUNK}
    with pytest.raises(DataError, match="different tokenizer"):
        prepare([str(src)], out, tokenizer=str(other / "tokenizer.model"), **kw)
    with pytest.raises(DataError, match="different inputs"):
        prepare([str(src)], out, vocab_size=600, **kw)
    argv = ["prepare", str(src), "--out", str(out), "--tokenizer", str(other / "tokenizer.model")]
    assert cli_main(argv) == 2
    assert {f.name: f.stat().st_mtime_ns for f in out.iterdir()} == before


def test_failed_prepare_leaves_nothing(small: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = small
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    before = sorted(p.name for p in out.parent.iterdir())
    tok = str(out / "tokenizer.model")
    with pytest.raises(DataError, match="no row holds text under 'text'"):
        prepare([str(bad)], out, tokenizer=tok, overwrite=True, num_proc=1)
    assert sorted(p.name for p in out.parent.iterdir()) == before  # no temp dir, out intact
    assert _bins(out)["train"].size > 0
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not a prepared data directory"):
        prepare([str(bad)], tmp_path / "junk", tokenizer=tok)


def test_jsonl_input_and_num_proc(small: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = small
    sp, tok = _sp(out), str(out / "tokenizer.model")
    docs = [f"Record {i}: " + "To be, or not to be. " * (i % 7 + 1) for i in range(40)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"content": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    kw = {"tokenizer": tok, "text_field": "content", "val_fraction": 0.1}
    metas = [prepare([str(src)], tmp_path / f"j{n}", num_proc=n, **kw) for n in (1, 2)]
    is_val = assign_split(len(docs), 0.1, seed=0)
    for split, mask in (("train", ~is_val), ("val", is_val)):
        expect = [t for d, m in zip(docs, mask, strict=True) if m for t in sp.encode(d) + [2]]
        assert _bins(tmp_path / "j1")[split].tolist() == expect
        assert _bins(tmp_path / "j2")[split].tolist() == expect
    assert metas[0]["documents"] == {"train": 36, "val": 4}


def _loader(d: Path, **kw: int) -> PackedLoader:
    args = {"seq_len": 64, "batch_size": 4, "seed": 0} | kw
    return PackedLoader(d, "train", **args)


def test_targets_are_shifted_inputs(small: tuple[Path, Path]) -> None:
    out = small[1]
    tokens = _bins(out)["train"].astype(np.int64)
    loader = _loader(out)
    x, y = next(loader)
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, k in zip(x, loader.epoch_order(0)[:4], strict=True):
        assert row.tolist() == tokens[k * 64 : k * 64 + 64].tolist()
    assert loader.num_sequences == (len(tokens) - 1) // 64 and loader.vocab_size == 512


def test_shuffle_deterministic_and_epoch_covers_all(small: tuple[Path, Path]) -> None:
    out = small[1]
    a, b, c = _loader(out), _loader(out), _loader(out, seed=1)
    xa, xb, xc = (torch.cat([next(it)[0] for _ in range(3)]) for it in (a, b, c))
    assert torch.equal(xa, xb) and not torch.equal(xa, xc)
    # One epoch visits distinct windows, each sequence index once, in the permutation's order.
    tokens = torch.from_numpy(_bins(out)["train"].astype(np.int64))
    fresh = _loader(out)
    rows = torch.cat([next(fresh)[0] for _ in range(fresh.steps_per_epoch)])
    order = fresh.epoch_order(0)
    assert sorted(order.tolist()) == list(range(fresh.num_sequences))
    want = torch.stack([tokens[k * 64 : k * 64 + 64] for k in order[: len(rows)]])
    assert torch.equal(rows, want)
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))  # reshuffled per epoch


def test_rank_sharding_matches_single_rank(small: tuple[Path, Path]) -> None:
    out = small[1]
    one = _loader(out, batch_size=6)
    ranks = [_loader(out, batch_size=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(one.steps_per_epoch + 3):  # crosses an epoch boundary
        x, y = next(one)
        (x0, y0), (x1, y1) = (next(r) for r in ranks)
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
        assert all(not torch.equal(p, q) for p in x0 for q in x1)  # disjoint samples
    evals = [list(r.iter_eval(2)) for r in ranks]
    for (x, _), (x0, _), (x1, _) in zip(one.iter_eval(2), *evals, strict=True):
        assert torch.equal(torch.cat([x0, x1]), x)


def test_state_dict_resume(small: tuple[Path, Path]) -> None:
    out = small[1]
    a = _loader(out)
    for _ in range(a.steps_per_epoch - 1):  # resume point one step before the epoch ends
        next(a)
    state = a.state_dict()
    want = [next(a) for _ in range(4)]
    b = _loader(out)
    b.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON round trip
    for (xw, yw), (xg, yg) in zip(want, (next(b) for _ in range(4)), strict=True):
        assert torch.equal(xw, xg) and torch.equal(yw, yg)
    assert b.epoch == 1
    with pytest.raises(DataError, match="seed"):
        _loader(out, seed=5).load_state_dict(state)


def test_iter_eval_unshuffled(small: tuple[Path, Path]) -> None:
    out = small[1]
    val = _bins(out)["val"].astype(np.int64)
    loader = _loader(out, seq_len=32, batch_size=2)
    first = list(loader.iter_eval(3))
    assert len(first) == min(3, ((len(val) - 1) // 32) // 2)
    x, y = first[0]
    assert x[0].tolist() == val[:32].tolist() and y[1].tolist() == val[33:65].tolist()
    assert all(torch.equal(p[0], q[0]) for p, q in zip(first, loader.iter_eval(3), strict=True))


def test_bad_dir_and_sizes(small: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        PackedLoader(tmp_path / "missing", "train", 8, 2)
    with pytest.raises(DataError, match="not a prepared data directory"):
        PackedLoader(tmp_path, "train", 8, 2)
    with pytest.raises(DataError, match="seq_len 1000000 exceeds"):
        PackedLoader(small[1], "train", 1_000_000, 2)
    with pytest.raises(DataError, match="fewer than one global batch"):
        PackedLoader(small[1], "val", 64, 10_000)


def test_cli_prepare(
    small: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, out = small
    argv = ["prepare", str(src), "--out", str(tmp_path / "c"), "--tokenizer"]
    assert cli_main([*argv, str(out / "tokenizer.model"), "--num-proc", "1"]) == 0
    assert json.loads((tmp_path / "c" / "meta.json").read_text())["vocab_size"] == 512
    assert cli_main(["prepare", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "d")]) == 2
    assert "input file not found" in capsys.readouterr().err
