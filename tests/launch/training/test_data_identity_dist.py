"""Data identity on FSDP2 (2 ranks, gloo, CPU): a run whose data directory was re-prepared with
another SentencePiece model of the same vocabulary size is refused by `normlab launch`, --force
included, on one line naming the source and its tokenizer; --resume-on-changed-data reaches every
rank and the run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.data.prepare import prepare, read_meta

from tests.dist_helpers import check_ok, launch, prepare_tiny, write_recipe

pytestmark = pytest.mark.distributed
FSDP = ("engine.name=fsdp", "data.batch_size=2")  # 2 ranks x 2 = the recipe's global batch 4


def test_fsdp_resume_on_retokenized_data_is_refused_then_allowed(tmp_path: Path) -> None:
    data = prepare_tiny(tmp_path)
    recipe = write_recipe(tmp_path, data, steps=4, every=4)
    run = tmp_path / "run"
    check_ok(launch(recipe, run, 2, *FSDP))
    old_sha = read_meta(data)["tokenizer"]["sha256"]
    prepare([str(tmp_path / "slice.txt")], data, vocab_size=512, model_type="unigram",
            val_fraction=0.05, num_proc=1, overwrite=True)  # fmt: skip
    assert read_meta(data)["tokenizer"]["sha256"] != old_sha

    refused = launch(recipe, run, 2, *FSDP, extra=("--force",))
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = [ln for ln in refused.stderr.splitlines() if "data changed" in ln]
    assert len(lines) == 1, refused.stderr[-3000:]
    assert f"source 'prepared' ({data}): tokenizer (sha256 {old_sha[:12]}... -> " in lines[0]
    assert "Traceback" not in refused.stderr

    more = (*FSDP, "training.steps=6")
    allowed = launch(recipe, run, 2, *more, extra=("--force", "--resume-on-changed-data"))
    check_ok(allowed)
    assert "on changed data (--resume-on-changed-data)" in allowed.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000006"
