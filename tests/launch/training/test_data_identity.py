"""A run never resumes on data it was not trained on: every checkpoint records each source's
tokenizer hash, shards fingerprint and sequence count (data.identity); resume, `--force`
included, refuses a change in one line naming the source and what changed, unless
--resume-on-changed-data. Cases: the directory re-prepared with another SentencePiece model of
the same vocabulary size, re-prepared from another text with the same tokenizer, and another
directory swapped in under the same path; a checkpoint older than the check still resumes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from normlab.data.identity import identity_changes, shards_fingerprint, source_identity
from normlab.data.loader import PackedSource
from normlab.data.prepare import prepare, read_meta
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.errors import CheckpointError
from normlab.launch.rundir.manifest import write_manifest
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"
SEQ = 64


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def _slice(tiny_data: Path) -> Path:
    return tiny_data.parent / "slice.txt"  # the text tiny_data was prepared from


def _trained(tiny_data: Path, tmp: Path, **kw: object) -> tuple[Path, Path, list[str]]:
    """A copy of tiny_data as `tmp/corpus` and a 4-step run on it (checkpoint at step 4)."""
    data = tmp / "corpus"
    shutil.copytree(tiny_data, data)
    run = tmp / "run"
    over = tiny_overrides(data, run, training__steps=4, **kw)
    assert Trainer(load_config(PRE, over)).run() == 0
    return data, run, over


def _resume(over: list[str], **kw: bool) -> Trainer:
    trainer = Trainer(load_config(PRE, over), **kw)
    trainer.run()
    return trainer


def _refusal(over: list[str], force: bool = False) -> str:
    with pytest.raises(CheckpointError) as info:
        _resume(over, force=force)
    return str(info.value)


def _ckpt_identity(run: Path) -> list[dict]:
    extra = torch.load(run / "checkpoints" / "step_00000004" / "trainer.pt", weights_only=False)
    return extra["data_identity"]


def test_identity_is_recorded_and_stable_under_an_identical_preparation(
    tiny_data: Path, tmp_path: Path
) -> None:
    data, run, _ = _trained(tiny_data, tmp_path)
    (saved,) = _ckpt_identity(run)
    meta = read_meta(data)
    n = (int(meta["tokens"]["train"]) - 1) // SEQ  # windows of SEQ + 1 tokens, by hand
    assert saved == {
        "name": "corpus",
        "path": str(data),
        "tokenizer": meta["tokenizer"]["sha256"],
        "shards": shards_fingerprint(data, meta),
        "sequences": n,
    }
    assert saved["sequences"] == PackedSource(data, SEQ).num_sequences("train")
    # the same inputs and tokenizer prepared again (new `created`, timings): the same identity
    tok = tmp_path / "tok.model"
    shutil.copy(data / "tokenizer.model", tok)
    prepare([str(_slice(tiny_data))], data, tokenizer=str(tok), val_fraction=0.02, num_proc=1,
            overwrite=True)  # fmt: skip
    again = source_identity("corpus", data, read_meta(data), n)
    assert again == saved
    assert identity_changes([saved], [again]) == []


def test_retokenized_directory_is_refused_force_included(tiny_data: Path, tmp_path: Path) -> None:
    data, run, over = _trained(tiny_data, tmp_path)
    old_sha = read_meta(data)["tokenizer"]["sha256"]
    # another SentencePiece model of the same vocabulary size (unigram instead of bpe)
    prepare([str(_slice(tiny_data))], data, vocab_size=512, model_type="unigram",
            val_fraction=0.02, num_proc=1, overwrite=True)  # fmt: skip
    new_meta = read_meta(data)
    assert new_meta["vocab_size"] == 512 and new_meta["tokenizer"]["sha256"] != old_sha
    for force in (False, True):
        msg = _refusal(over, force=force)
        assert "\n" not in msg
        assert f"source 'corpus' ({data})" in msg
        assert f"tokenizer (sha256 {old_sha[:12]}... -> " in msg
        assert "--resume-on-changed-data" in msg
    # the CLI: one line on stderr, exit 2, nothing written to the run
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    args = ["train", str(PRE), *over, "--force"]
    assert main(args) == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_reprepared_text_is_refused_naming_shards_and_sequences(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, run, over = _trained(tiny_data, tmp_path)
    (saved,) = _ckpt_identity(run)
    tok = tmp_path / "tok.model"
    shutil.copy(data / "tokenizer.model", tok)
    lines = _slice(tiny_data).read_text().splitlines(keepends=True)
    other = tmp_path / "other.txt"
    other.write_text("".join(lines[5000:]))  # another text, same tokenizer
    prepare([str(other)], data, tokenizer=str(tok), val_fraction=0.02, num_proc=1,
            overwrite=True)  # fmt: skip
    n_now = PackedSource(data, SEQ).num_sequences("train")
    assert n_now < saved["sequences"]
    msg = _refusal(over)
    assert "tokenizer" not in msg.split(": ", 1)[1].split(";")[0]  # the same tokenizer
    assert f"shards (other files), sequence count ({saved['sequences']} -> {n_now})" in msg
    # allowed by the flag whose name says it: a notice, training goes on to the new end
    over8 = [o for o in over if not o.startswith("training.steps=")] + ["training.steps=8"]
    args = ["train", str(PRE), *over8, "--force", "--resume-on-changed-data"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "resuming step_00000004 on changed data (--resume-on-changed-data)" in out
    # the new checkpoints record the new data: the plain resume command normlab prints works
    extra = torch.load(run / "checkpoints" / "step_00000008" / "trainer.pt", weights_only=False)
    assert extra["data_identity"][0]["sequences"] == n_now
    assert main(["train", str(run)]) == 0


def test_directory_swapped_under_the_same_path_is_refused(
    tiny_data: Path, arith_data: Path, tmp_path: Path
) -> None:
    data, _, over = _trained(tiny_data, tmp_path)
    shutil.move(data, tmp_path / "corpus.old")
    shutil.copytree(arith_data, data)  # another prepared directory (same tokenizer) in its place
    msg = _refusal(over, force=True)
    assert f"source 'corpus' ({data}): shards (other files), sequence count (" in msg
    assert "tokenizer (" not in msg


def test_checkpoint_without_identity_resumes_with_a_note(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, run, over = _trained(tiny_data, tmp_path)
    ckpt = run / "checkpoints" / "step_00000004"
    extra = torch.load(ckpt / "trainer.pt", weights_only=False)
    del extra["data_identity"]  # as a normlab before this check wrote it
    torch.save(extra, ckpt / "trainer.pt")
    write_manifest(ckpt)
    capsys.readouterr()
    over8 = [o for o in over if not o.startswith("training.steps=")] + ["training.steps=8"]
    assert main(["train", str(PRE), *over8, "--force"]) == 0
    out = capsys.readouterr().out
    note = [line for line in out.splitlines() if "records no data identity" in line]
    assert note == [
        "checkpoint step_00000004 records no data identity (written before normlab recorded "
        "it): the data it resumes on is not checked; the next checkpoint records it"
    ]


def test_launch_passes_the_flag_to_every_rank(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over = [*tiny_overrides(tiny_data, tmp_path / "run"), "engine.name=fsdp"]
    args = ["launch", str(PRE), *over, "--nproc-per-node", "2", "--dry-run"]
    assert main([*args, "--resume-on-changed-data"]) == 0
    assert capsys.readouterr().out.split().count("--resume-on-changed-data") == 1
    assert main(args) == 0
    assert "--resume-on-changed-data" not in capsys.readouterr().out


def test_launch_refuses_changed_data_before_torchrun(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, run, over = _trained(tiny_data, tmp_path)
    shutil.rmtree(data)
    lines = _slice(tiny_data).read_text().splitlines(keepends=True)
    other = tmp_path / "other.txt"
    other.write_text("".join(lines[:15000]))
    prepare([str(other)], data, vocab_size=512, val_fraction=0.02, num_proc=1)
    capsys.readouterr()
    args = ["launch", str(run), "engine.name=fsdp", "--nproc-per-node", "2", "--dry-run"]
    assert main([*args, "--force"]) == 2  # the launcher's own check: torchrun never starts
    err = capsys.readouterr().err.strip()
    assert err.startswith("normlab launch: error: the data changed since checkpoint step_00000004")
    assert "source 'corpus'" in err and "shards (other files), sequence count (" in err
    assert main([*args, "--force", "--resume-on-changed-data"]) == 0
