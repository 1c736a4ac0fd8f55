"""A prepared directory's meta.json is read by one reader (data.meta_file.load_meta) wherever
it is read: the loader, the config builder (its vocabulary), `normlab train`, provenance. A
damaged one, in every way a hand edit or a cut-off copy leaves it, is refused in one line naming
the file and the key, exit 2 through the CLI, never a traceback (issue 47: every value read from a
file is validated where it is read)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from normlab.data import DataError
from normlab.data.loader import PackedLoader
from normlab.data.meta_file import load_meta, meta_of
from normlab.data.prepare import prepare
from normlab.launch.cli import main

LINES = "".join(f"line {i} of a tiny corpus, with words enough to train on.\n" for i in range(600))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("meta")
    src = root / "c.txt"
    src.write_text(LINES)
    out = root / "prepared"
    prepare([str(src)], out, vocab_size=320, val_fraction=0.1, num_proc=1, chunk_lines=8)
    return out


def _edit(meta: dict, key: str, value: object) -> dict:
    out = json.loads(json.dumps(meta))
    if value is DELETE:
        del out[key]
    else:
        out[key] = value
    return out


DELETE = object()
BAD_VALUES = [
    ("vocab_size", -5),
    ("vocab_size", 0),
    ("vocab_size", 256.5),
    ("vocab_size", True),
    ("vocab_size", "256"),
    ("vocab_size", DELETE),
    ("dtype", "float32"),
    ("dtype", "uint32"),  # not the dtype of a 320-piece vocabulary
    ("tokens", {"train": -1, "val": 10}),
    ("tokens", {"train": 1.5, "val": 10}),
    ("tokens", {"train": 100}),
    ("tokens", [100, 10]),
    ("tokenizer", "tokenizer.model"),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=lambda x: repr(x)[:20])
def test_a_bad_value_is_named_by_file_and_key(
    prepared: Path, tmp_path: Path, key: str, value: object
) -> None:
    d = tmp_path / "d"
    shutil.copytree(prepared, d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps(_edit(meta, key, value)))
    with pytest.raises(DataError) as err:
        PackedLoader(d, "train", 8, 2)
    text = str(err.value)
    assert "\n" not in text and str(d / "meta.json") in text and key in text, text


@pytest.mark.parametrize(
    "damage",
    [
        lambda t: t.encode()[:-9] + b"\xff\xfe}",  # not UTF-8
        lambda t: t[: len(t) // 2].encode(),  # cut off
        lambda t: ('{"vocab_size": 256, ' + t[1:]).encode(),  # a key twice
        lambda t: b"[1, 2, 3]",  # not an object
        lambda t: b"",
    ],
    ids=["not-utf8", "cut-off", "key-twice", "not-object", "empty"],
)
def test_damaged_text_is_refused_in_one_line(prepared: Path, tmp_path: Path, damage) -> None:
    d = tmp_path / "d"
    shutil.copytree(prepared, d)
    (d / "meta.json").write_bytes(damage((d / "meta.json").read_text()))
    with pytest.raises(DataError) as err:
        load_meta(d / "meta.json")
    assert "\n" not in str(err.value) and str(d / "meta.json") in str(err.value)


def test_train_on_a_damaged_directory_exits_2_in_one_line(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    d = tmp_path / "d"
    shutil.copytree(prepared, d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps(_edit(meta, "tokens", {"train": -3, "val": 1})))
    run = tmp_path / "run"
    argv = [
        "train",
        "pre",
        f"data.dataset={d}",
        "training.steps=2",
        "schedule.warmup_steps=1",
        f"run_dir={run}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokens" in err[0] and "meta.json" in err[0], err


def test_a_good_directory_reads_and_a_missing_one_is_none(prepared: Path, tmp_path: Path) -> None:
    meta = meta_of(prepared)
    assert meta is not None and meta["vocab_size"] == 320 and meta["dtype"] == "uint16"
    assert meta_of(tmp_path / "gone") is None and meta_of("bundled") is None
