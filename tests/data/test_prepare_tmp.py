"""An interrupted `prepare --tokenizer` leaves nothing behind for long: SIGTERM (and SIGHUP)
remove the temporary `.NAME.tmp-XXXXXXXX/` folder and end the process by that signal; after a
SIGKILL the next prepare of the same --out removes the folder (its owner's PID is gone) and
prepares; a live preparation's folder, and a recent ownerless one, are left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from normlab.data.prepare import prepare
from normlab.data.prepare_tmp import OWNER, STALE_S, make_tmp, remove_stale

from tests.conftest import REPO

LINES = 3000


def _text(tiny_data: Path, tmp_path: Path) -> Path:
    src = tmp_path / "text.txt"
    lines = (tiny_data.parent / "slice.txt").read_text().splitlines(keepends=True)
    src.write_text("".join(lines[:LINES]))
    return src


def _stopped_prepare(src: Path, out: Path, tokenizer: Path, sig: int) -> Path:
    """Run `prepare --tokenizer` in a child whose build pauses once its shards are written,
    send `sig` there; return the temporary folder it was building in."""
    code = textwrap.dedent(f"""
        import signal
        import time
        import normlab.data.prepare as p
        # a terminal's child: both stop signals at their default action and unblocked (pytest
        # under nohup, or a worker an earlier test left ignoring SIGTERM, would pass SIG_IGN
        # down, and a preparation started that way rightly keeps ignoring it)
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGHUP))
        real = p.build
        def paused(srcs, sizes, tmp, *rest):
            meta = real(srcs, sizes, tmp, *rest)
            print("built", tmp, flush=True)
            for _ in range(1200):  # short sleeps: the kernel may hand the signal to another
                time.sleep(0.1)    # thread (BLAS, the pool's), and CPython runs the handler
            return meta            # only when the main thread wakes; one 120 s sleep would wait
        p.build = paused
        p.prepare([{str(src)!r}], {str(out)!r}, tokenizer={str(tokenizer)!r},
                  val_fraction=0.05, num_proc=2)
    """)
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("built "):
        proc.kill()
        pytest.fail(f"the child did not reach its build: {proc.communicate()[1][-2000:]}")
    tmp = Path(line.split(" ", 1)[1].strip())
    assert tmp.is_dir() and (tmp / "train.bin").stat().st_size > 0 and (tmp / OWNER).is_file()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        masks = [line for line in status.splitlines() if line.startswith(("Sig", "Shd"))]
        proc.kill()
        pytest.fail(f"the child outlived {sig!r} by 60 s; {masks}; {proc.communicate()[1][-2000:]}")
    assert proc.returncode == -sig, proc.stderr.read()[-2000:]
    proc.stdout.close()
    proc.stderr.close()
    return tmp


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_removes_the_temporary_folder(tiny_data: Path, tmp_path: Path, sig) -> None:
    src, out = _text(tiny_data, tmp_path), tmp_path / "prepared"
    tmp = _stopped_prepare(src, out, tiny_data / "tokenizer.model", sig)
    assert not tmp.exists() and not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_after_sigkill_the_next_prepare_removes_the_folder(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = _text(tiny_data, tmp_path), tmp_path / "prepared"
    tok = tiny_data / "tokenizer.model"
    tmp = _stopped_prepare(src, out, tok, signal.SIGKILL)
    assert tmp.is_dir()  # a SIGKILL cannot be caught
    pid = json.loads((tmp / OWNER).read_text())["pid"]
    live = make_tmp(out)  # a preparation running now (this process): kept
    meta = prepare([str(src)], out, tokenizer=str(tok), val_fraction=0.05, num_proc=1)
    err = capsys.readouterr().err
    assert f"removed {tmp}, left by an interrupted prepare (PID {pid} is gone)" in err
    assert not tmp.exists() and live.is_dir()
    assert (out / "train.bin").stat().st_size == meta["tokens"]["train"] * 2  # uint16 ids
    assert not (out / OWNER).exists()  # the owner file stays out of the prepared directory


def test_ownerless_folders_go_once_untouched_for_an_hour(tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    old, recent = tmp_path / ".prepared.tmp-old00000", tmp_path / ".prepared.tmp-new00000"
    for d in (old, recent):
        d.mkdir()
        (d / "train.bin").write_bytes(b"\0" * 64)
    then = time.time() - STALE_S - 60
    for p in (old / "train.bin", old):
        os.utime(p, (then, then))
    other = tmp_path / ".other.tmp-x"  # another --out's folder: not this prepare's
    other.mkdir()
    os.utime(other, (then, then))
    lines = remove_stale(out)
    assert len(lines) == 1 and lines[0].startswith(f"removed {old}, left by an interrupted")
    assert "no owner, untouched for 36" in lines[0]  # 3660 s (give or take the test's seconds)
    assert not old.exists() and recent.is_dir() and other.is_dir()
