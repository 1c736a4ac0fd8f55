"""`normlab prepare` on bad input: one line and exit 2 for every file type it cannot use (empty,
binary, not UTF-8, a directory with none of its file types, jsonl without a text column); not
UTF-8 lines can be skipped (counted); very long lines still train a tokenizer; a small validation
split warns; success ends with the command that trains on the result."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from normlab.launch.cli import main


def _prepare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["prepare", *args, "--vocab-size", "300", "--num-proc", "1"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    (d / "none").mkdir(parents=True)
    (d / "none" / "notes.py").write_text("print('not a supported type')\n")
    (d / "empty.txt").write_bytes(b"")
    (d / "binary.txt").write_bytes(bytes(range(256)) * 20)
    (d / "latin1.txt").write_bytes(b"ascii\n" + ("caf\xe9 na\xefve\n" * 50).encode("latin-1"))
    (d / "all_latin1.txt").write_bytes(("caf\xe9\n" * 5).encode("latin-1"))
    (d / "nofield.jsonl").write_text(json.dumps({"body": "hello"}) + "\n")
    (d / "numbers.jsonl").write_text(json.dumps({"text": 5}) + "\n")
    return d


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("empty.txt", "is empty"),
        ("binary.txt", "looks binary"),
        ("latin1.txt", "is not UTF-8 text (50 undecodable lines, the first is line 2)"),
        ("all_latin1.txt", "holds no UTF-8 text"),
        ("none", "holds no .txt"),
        ("missing.txt", "input file not found"),
        (
            "nofield.jsonl",
            "no row holds text under 'text' (1 rows; the first has the fields "
            "['body']); set --text-field",
        ),
        ("numbers.jsonl", "the first has 'text': int); set --text-field"),
    ],
)
def test_bad_inputs_are_one_line(
    inputs: Path, capsys: pytest.CaptureFixture[str], name: str, needle: str
) -> None:
    out_dir = inputs.parent / "out"
    code, _, err = _prepare(capsys, str(inputs / name), "--out", str(out_dir))
    last = err.strip().splitlines()[-1]  # above it only datasets' progress bars
    assert code == 2 and needle in last and "Traceback" not in err, err
    assert not out_dir.exists()


def test_skip_undecodable_long_lines_small_val_and_the_train_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "corpus"
    d.mkdir()
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = " ".join("".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(30000))
    (d / "long.txt").write_text(words + "\n" + "short line of text\n" * 20)  # a 160k-char line
    (d / "mixed.txt").write_bytes(b"good line\n" + "bad \xe9\n".encode("latin-1") * 3)
    out = tmp_path / "prepared"
    args = ("--out", str(out), "--skip-undecodable", "--val-fraction", "0")
    code, stdout, err = _prepare(capsys, str(d), *args)
    assert code == 0, err
    assert "skipping 3 undecodable (not UTF-8) lines" in err
    assert f"train on it: normlab train pre data.dataset={out}" in stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 300 and meta["tokens"]["train"] > 0


def test_small_validation_split_warns(capsys: pytest.CaptureFixture[str]) -> None:
    from normlab.data.prepare import _warn_small_val

    _warn_small_val({"train": 9990, "val": 10}, 0.005)  # 0.1 % of tokens, 0.5 % asked
    assert "holds 10 tokens (0.10%), less than the 0.50% asked" in capsys.readouterr().err
    _warn_small_val({"train": 9950, "val": 50}, 0.005)
    assert capsys.readouterr().err == ""


def test_unwritable_out_and_full_disk_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import normlab.data.prepare_build as prepare_build

    src = tmp_path / "a.txt"
    rng = random.Random(0)
    words = ("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5)) for _ in range(20000))
    src.write_text("".join(" ".join(next(words) for _ in range(20)) + "\n" for _ in range(1000)))
    (tmp_path / "file").write_text("x")
    code, _, err = _prepare(capsys, str(src), "--out", str(tmp_path / "file" / "out"))
    assert (
        code == 2
        and f"{tmp_path / 'file'} is a file, not a directory" in err.strip().splitlines()[-1]
    )

    def full(*args: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x" / "train.bin"))

    monkeypatch.setattr(prepare_build, "SplitWriter", full)
    code, _, err = _prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    last = err.strip().splitlines()[-1]
    assert code == 2 and "no space left on device while writing" in last and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "file"]  # no temp folder


def _words(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5)) for _ in range(n)]


def test_directory_reads_text_like_files_and_names_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    words = _words(4000)
    (d / "a.txt").write_text(
        "".join(" ".join(words[i : i + 10]) + "\n" for i in range(0, 2000, 10))
    )
    (d / "sub" / "notes.md").write_text("# notes\n" + " ".join(words[2000:]) + "\n")
    (d / "sub" / "tool.py").write_text("print('code')\n")
    (d / "logo.png").write_bytes(b"\x89PNG\r\n")
    (d / ".git").mkdir()
    (d / ".git" / "HEAD.txt").write_text("ref: main\n")  # hidden: counted, not read
    code, _, err = _prepare(capsys, str(d), "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "skipping 2 file(s) of types prepare does not read" in err
    assert f"{d / 'logo.png'}, {d / 'sub' / 'tool.py'}" in err
    assert "skipping 1 hidden file(s)" in err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert [s["name"] for s in meta["sources"]] == ["a.txt", "notes.md"]


def test_jsonl_rows_without_text_are_counted_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = _words(3000)
    rows: list[object] = [{"text": " ".join(words[i : i + 100])} for i in range(0, 3000, 100)]
    rows[3], rows[7], rows[11] = {"body": "x"}, {"text": None}, {"text": 12}
    rows.append(["not", "an", "object"])
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank line is no row
    code, _, err = _prepare(
        capsys, str(src), "--out", str(tmp_path / "out"), "--val-fraction", "0.1"
    )
    assert code == 0, err
    assert "dropping 4 of 31 rows of rows.jsonl: no string under --text-field 'text'" in err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["sources"][0]["dropped_rows"] == 4 and meta["sources"][0]["documents"] == 27
    assert meta["documents"] == {"train": 24, "val": 3}


def test_single_document_input_cannot_give_a_validation_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "one_line.txt"
    line = " ".join(_words(1_000_000))  # 6 MB on one line: one document
    src.write_text(line + "\n")
    assert src.stat().st_size == 6_000_000
    code, _, err = _prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1, err
    assert "the inputs give 1 document" in err and "no validation split" in err
    assert "--val-fraction 0" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one_line.txt"]


def test_progress_shows_tokens_per_second_and_eta(tmp_path: Path) -> None:
    """On a terminal (TTY_COMPATIBLE forces rich to treat stderr as one) prepare draws its
    progress: input bytes done of the total, tokens, tokens/s and the time left."""
    import os
    import subprocess
    import sys

    src = tmp_path / "a.txt"
    src.write_text("".join(" ".join(_words(12, i)) + "\n" for i in range(3000)))
    cmd = [sys.executable, "-m", "normlab.data.cli", "prepare", str(src), "--out",
           str(tmp_path / "out"), "--vocab-size", "300", "--num-proc", "1"]  # fmt: skip
    env = os.environ | {"TTY_COMPATIBLE": "1", "COLUMNS": "160"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tokenizing" in proc.stderr and "tok/s" in proc.stderr and "ETA" in proc.stderr
    assert "tokens/s tokenizing with 1 process" in proc.stdout
