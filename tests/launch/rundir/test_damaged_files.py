"""Every file normlab reads may be damaged and every place it writes may be unwritable or full:
one line naming the file and what is wrong, exit 2, nothing written. A checkpoint without its
manifest is refused unless --allow-unverified accepts it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.rundir import directory as rundir
from normlab.launch.rundir.directory import LOCK, RunDirLock, read_lock

from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def run1(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny finished run (checkpoints at steps 4 and 8), copied by each test that damages."""
    run = tmp_path_factory.mktemp("damaged") / "run1"
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    try:
        assert main(["train", "pre", *tiny_overrides(tiny_data, run)]) == 0
    finally:
        mp.undo()
    return run


@pytest.fixture()
def run(run1: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run1, copy)
    return copy


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


DAMAGE = [
    ("config.yaml", b"- a\n- b\n", "config.yaml holds list"),
    ("config.yaml", b"5\n", "config.yaml holds int 5, not a run config mapping"),
    ("config.yaml", b"training: 5\n", "section 'training' holds int 5, not a mapping"),
    ("config.yaml", b"training: {steps: abc}\n", "training.steps must be an integer, got 'abc'"),
    ("config.yaml", b"\xff\xfe\x00garbage", "config.yaml is damaged: bytes that are not UTF-8"),
    ("config.yaml", b"a: [\n", "config.yaml is not valid YAML"),
    ("config.yaml", b"optim: {lr: abc}\n", "optim.lr must be a number, got 'abc'"),
    ("config.yaml", b"model: {placement: 5}\n", "model.placement must be one of 'post'"),
    ("config.yaml", b"name: [a]\n", "'name' is ['a'], not a string"),
    ("summary.json", b"[1, 2]\n", "summary.json holds list"),
    ("summary.json", b'{"status": 5}\n', "summary.json: 'status' is 5, expected str"),
    ("summary.json", b'{"status": "completed", "steps": "x"}\n', "'steps' is 'x', expected int"),
    ("summary.json", b'{"status": "completed", "tokens_per_s": [1]}\n', "'tokens_per_s' is [1]"),
    ("summary.json", b'{"status": ', "summary.json is not valid JSON"),
]
APPEND = [
    (bytes(range(128, 256)) * 3, "metrics.jsonl is damaged: bytes that are not UTF-8 text on line"),
    (b'{"step": "x", "loss": 1.0}\n', "has step 'x', not a step number"),
    (b'{"step": 3, "loss": [1]}\n', "'loss' is [1], not a number"),
    (b"[1, 2]\n", "holds list [1, 2], not a metrics row"),
    (b'not json\n{"step": 9, "loss": 1.0}\n', "metrics.jsonl is damaged: line 11 is not JSON"),
]


@pytest.mark.parametrize(("name", "content", "needle"), DAMAGE, ids=[d[2] for d in DAMAGE])
@pytest.mark.parametrize("command", ["status", "compare"])
def test_damaged_config_or_summary_is_one_line_naming_it(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    command: str, name: str, content: bytes, needle: str,
) -> None:  # fmt: skip
    (run / name).write_bytes(content)
    out = tmp_path / "report"
    code, err = _cli(
        capsys, command, str(run), *(["--out", str(out)] if command == "compare" else [])
    )
    _one_line(code, err, needle, str(run / name))
    assert not out.exists()


@pytest.mark.parametrize(("tail", "needle"), APPEND, ids=[a[1] for a in APPEND])
@pytest.mark.parametrize("command", ["status", "compare"])
def test_damaged_metrics_are_one_line_naming_the_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    command: str, tail: bytes, needle: str,
) -> None:  # fmt: skip
    with (run / "metrics.jsonl").open("ab") as fh:
        fh.write(tail)
    out = tmp_path / "report"
    code, err = _cli(
        capsys, command, str(run), *(["--out", str(out)] if command == "compare" else [])
    )
    _one_line(code, err, needle, "metrics.jsonl")
    assert not out.exists()


def test_a_half_written_last_line_is_what_a_live_run_leaves(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 9, "lo')
    capsys.readouterr()
    assert main(["status", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 8 and info["status"] == "completed"


def test_a_non_finite_step_time_gives_no_eta(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / "summary.json").write_text('{"status": "running", "steps": 9}\n')
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 9, "loss": "nan", "step_time": "nan"}\n')
    capsys.readouterr()
    assert main(["status", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.replace("NaN", "null"))["eta_s"] is None


@pytest.mark.parametrize(
    "fields",
    [{"pid": "x"}, {"pid": True}, {"pid": -4}, {"host": 5}, {"token": None}, {"pid": [1]}],
)
def test_a_lock_with_wrong_types_is_unreadable_and_old_garbage_is_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    owner = {"host": "h", "pid": 1, "started": "s", "token": "t", "proc_start": None} | fields
    (run / LOCK).write_text(json.dumps(owner))
    assert read_lock(run) is None
    old = time.time() - 60
    os.utime(run / LOCK, (old, old))
    with RunDirLock(run, "test") as lock:
        assert read_lock(run) == lock.owner
    assert "removed the unreadable lock file" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf"])
@pytest.mark.parametrize("env", ["NORMLAB_LOCK_STALE_S", "NORMLAB_LOCK_HEARTBEAT_S"])
def test_an_unparsable_lock_setting_is_one_line_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tiny_data: Path, env: str, value: str,
) -> None:  # fmt: skip
    monkeypatch.setenv(env, value)
    monkeypatch.setattr(rundir, "STALE_S", None)
    monkeypatch.setattr(rundir, "HEARTBEAT_S", None)
    run = tmp_path / "run"
    code, err = _cli(capsys, "train", "pre", *tiny_overrides(tiny_data, run))
    _one_line(code, err, f"{env} must be a number of seconds > 0, got {value!r}")
    assert not run.exists()


def _unverified(run: Path) -> Path:
    """Delete step 8's manifest and change a byte of its model: nothing can tell any more."""
    ckpt = run / "checkpoints" / "step_00000008"
    (ckpt / "manifest.json").unlink()
    model = next(p for p in sorted(ckpt.rglob("*.pt")) if "model" in p.name)
    data = bytearray(model.read_bytes())
    data[-100] ^= 0xFF
    model.write_bytes(bytes(data))
    return ckpt


def test_a_checkpoint_without_manifest_is_refused_unless_allowed(
    run: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    _unverified(run)
    before = sorted(p.name for p in run.rglob("*"))
    over = tiny_overrides(tiny_data, run, training__steps=9)
    for extra in ([], ["--from", "step_00000008"], ["--from", "8"]):
        code, err = _cli(capsys, "train", "pre", *over, "--force", *extra)
        _one_line(
            code, err, "checkpoint step_00000008 is damaged", "manifest.json is missing",
            "--allow-unverified", "the previous verified checkpoint is step_00000004",
        )  # fmt: skip
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written
    code, err = _cli(capsys, "train", "pre", *over, "--force", "--from", "step_00000004")
    assert code == 0, err
    shutil.rmtree(run / "checkpoints" / "step_00000009")
    (run / "checkpoints" / "latest").write_text("step_00000008\n")
    code, err = _cli(capsys, "train", "pre", *over, "--force", "--allow-unverified")
    assert code == 0, err


def test_export_refuses_an_unverified_checkpoint_and_its_own_checkpoints_folder(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    (run / "checkpoints" / "step_00000008" / "manifest.json").unlink()
    out = tmp_path / "export"
    code, err = _cli(capsys, "export", str(run), "--out", str(out), "--no-hf")
    _one_line(code, err, "step_00000008 is damaged", "manifest.json is missing")
    assert not out.exists()
    for inside in ("checkpoints", "checkpoints/export", "checkpoints/step_00000004"):
        code, err = _cli(capsys, "export", str(run), "--out", str(run / inside), "--no-hf",
                         "--allow-unverified")  # fmt: skip
        _one_line(code, err, "lies in the run's own")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "latest", "step_00000004", "step_00000008",
    ]  # fmt: skip
    assert (
        _cli(capsys, "export", str(run), "--out", str(out), "--no-hf", "--allow-unverified")[0] == 0
    )
    assert (out / "normlab" / "model.safetensors").is_file()


def test_export_of_a_placement_without_hf_family_exits_2_writing_nothing(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    text = (run / "config.yaml").read_text().replace("placement: pre", "placement: post")
    (run / "config.yaml").write_text(text)
    out = tmp_path / "export"
    code, err = _cli(capsys, "export", str(run), "--out", str(out))
    _one_line(code, err, "placement='post'", "--no-hf")
    assert not out.exists() and list(tmp_path.iterdir()) == [run]


@pytest.mark.parametrize("where", ["safetensors", "tokenizer", "publish"])
def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, where: str,
) -> None:  # fmt: skip
    import normlab.launch.export as export

    monkeypatch.setenv("NORMLAB_CACHE", str(run.parent / "cache"))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    target = {"safetensors": "save_safetensors", "tokenizer": "shutil", "publish": "publish"}
    if where == "tokenizer":
        monkeypatch.setattr(export.shutil, "copyfile", full)
    else:
        monkeypatch.setattr(export, target[where], full)
    out = tmp_path / "export"
    code, err = _cli(capsys, "export", str(run), "--out", str(out), "--no-hf")
    _one_line(code, err, "no space left on device")
    assert sorted(tmp_path.iterdir()) == [run]  # no export, no temporary folder


@pytest.mark.parametrize("command", ["theory", "compare"])
def test_report_out_below_a_regular_file_is_refused_before_measuring(
    run1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine\n")
    runs = [str(run1)] if command == "compare" else []
    code, err = _cli(capsys, command, *runs, "--out", str(blocker / "sub"))
    _one_line(code, err, f"{blocker} is a file, not a directory")
    assert blocker.read_text() == "mine\n"


def _as_nobody() -> list[str] | None:
    """A command prefix that drops root (a read-only directory binds only other users)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


def test_a_read_only_run_directory_is_one_line(run: Path, tiny_data: Path) -> None:
    prefix = _as_nobody()
    if prefix is None:
        pytest.skip("running as root without setpriv: a read-only directory binds nobody")
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import normlab.launch.cli"],
        capture_output=True, text=True, cwd="/", env={**os.environ, "HOME": "/tmp"},
    )
    if probe.returncode != 0:  # e.g. a checkout below a folder only root may enter (mktemp -d)
        pytest.skip(f"the unprivileged user cannot import normlab here: {probe.stderr[-200:]}")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # pytest's own folders are private to root
        root = Path(tmp)
        shutil.copytree(run, root / "run")
        shutil.copytree(tiny_data, root / "data")
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o555)  # readable by the unprivileged user
        for path in [root / "run", *(root / "run").rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        (root / "home").mkdir()
        (root / "home").chmod(0o777)  # the unprivileged user's HOME and caches
        before = {p: p.stat().st_mtime_ns for p in (root / "run").rglob("*")}
        over = tiny_overrides(root / "data", root / "run", training__steps=9)
        cmd = [
            *prefix,
            sys.executable,
            "-m",
            "normlab.launch.cli",
            "train",
            "pre",
            *over,
            "--force",
        ]
        home = str(root / "home")
        env = {**os.environ, "HOME": home, "MPLCONFIGDIR": home, "NORMLAB_CACHE": home}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=home)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"{root / 'run' / LOCK}: Permission denied" in done.stderr
        assert {p: p.stat().st_mtime_ns for p in (root / "run").rglob("*")} == before


def test_a_full_disk_while_writing_the_summary_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "summary.json").write_text('{"status": "running"}\n')
    real = Path.write_text

    def half(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real(self, text[:5])  # part of the file reached the disk
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(OSError, match="No space left"):
        rundir.write_summary(tmp_path, {"status": "completed"})
    monkeypatch.undo()
    assert (tmp_path / "summary.json").read_text() == '{"status": "running"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
