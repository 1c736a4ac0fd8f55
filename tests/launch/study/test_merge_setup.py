"""`--merge` refuses runs trained as another experiment (launch.study.setup, merge_checks): the
setup hash leaves out what may differ between two seeds of one grid point (seed, folders, device,
threads, logging, how the batch is split, a corpus path's folder) and keeps what defines the
experiment; a source run with other steps is refused in one line naming the key, by the hash
where results.csv carries it and by compare.csv's columns where it does not, and DIR is left as
it was."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.config.loader import find_recipe
from normlab.launch.study.merge_checks import _cell_of
from normlab.launch.study.setup import setup_diff, setup_of
from normlab.launch.verdicts.results_table import read_results

from tests.launch.study.test_merge import _rows, _seed_0_and_seed_1


def _config(*overrides: str) -> dict:
    return load_config(find_recipe("pre"), list(overrides)).to_dict()


@pytest.mark.parametrize(
    "override",
    [
        "training.seed=7",
        "run_dir=/elsewhere/run_s7",
        "name=other_label",
        "training.threads=4",
        "training.device=cpu",
        "training.log_every=1",
        "training.eval_every=5",
        "logging.tensorboard=false",
        "checkpoint.every=3",
        "engine.compile=true",
        "instruments.attention_logits=false",
    ],
)
def test_what_may_differ_between_seeds_keeps_the_setup(override: str) -> None:
    assert setup_of(_config(override)) == setup_of(_config())


@pytest.mark.parametrize(
    "override",
    [
        "training.steps=700",
        "precision.dtype=bf16",
        "data.seq_len=32",
        "optim.lr=0.5",
        "optim.weight_decay=0.0",
        "schedule.warmup_steps=3",
        "model.qk_norm=head",
        "data.vocab_size=2048",
        "instruments.fp16_clamp.mode=off",
    ],
)
def test_what_defines_the_experiment_changes_the_setup(override: str) -> None:
    key = override.split("=")[0]
    assert setup_of(_config(override)) != setup_of(_config())
    differ = setup_diff(_config(), _config(override))
    assert any(line.startswith(f"{key}: ") for line in differ), differ


def test_the_global_batch_counts_not_its_split_and_a_corpus_by_its_name() -> None:
    a = _config("data.batch_size=8", "training.grad_accum=1")
    b = _config("data.batch_size=4", "training.grad_accum=2")
    assert setup_of(a) == setup_of(b)
    assert setup_of(_config("data.batch_size=4")) != setup_of(a)
    a["data"]["dataset"], b["data"]["dataset"] = "/home/me/corpus.txt", "/scratch/x/corpus.txt"
    assert setup_of(a) == setup_of(b)
    b["data"]["dataset"] = "/scratch/x/other.txt"
    assert setup_diff(a, b) == ["data.dataset: 'corpus.txt' -> 'other.txt'"]
    assert len(setup_of(a)) == 12


def test_a_run_name_without_its_rate_and_seed_is_its_recipe_and_size() -> None:
    assert _cell_of("peri_completep_lr0.0004883_n_layers16_s4") == "peri_completep_n_layers16"
    assert _cell_of("pre_smooth_swigluFalse_lr0.001_s0") == "pre_smooth_swigluFalse"
    assert _cell_of("pre_nowarmup_lr1e-05_s12") == "pre_nowarmup"


def test_layernorm_scaling_in_its_old_spelling_is_the_same_setup() -> None:
    """A run saved before LayerNorm Scaling was a placement (placement: pre, ln_scaling: true)
    is the same experiment as today's placement: ln_scaling, as resume already reads it."""
    new = load_config(find_recipe("ln_scaling"), []).to_dict()
    old = {**new, "model": {**new["model"], "placement": "pre", "ln_scaling": True}}
    assert setup_of(old) == setup_of(new) and setup_diff(old, new) == []


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def test_a_source_trained_with_other_steps_is_refused_naming_the_key(
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    study, out, more = _seed_0_and_seed_1(tiny_data, tmp_path, monkeypatch, "--steps", "3")
    hashes = {r.setup for r in read_results(out / "results.csv")}
    assert len(hashes) == 2 and "" not in hashes  # one per grid point (its lr)
    before = _snapshot(out)
    capsys.readouterr()
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"normlab study: error: --merge {more}: recipe pre_nowarmup size - lr ")
    assert "seed 1 was trained with another setup than seed 0 in" in line
    assert "(training.steps: 4 -> 3)" in line
    assert line.endswith("run it with the same study file, --steps and --set")
    assert _snapshot(out) == before
    # without the run directories the line gives the two hashes
    import shutil

    shutil.rmtree(more / "runs")
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 2
    assert "(setup " in capsys.readouterr().err
    # a table written before the setup column: compare.csv's steps column still refuses it
    for table in (out / "results.csv", more / "results.csv"):
        rows = _rows(table)
        for r in rows:
            r["setup"] = ""
        with table.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    before = _snapshot(out)
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "has steps '3', but " in line
    assert "'s runs of the same recipe and size have '4' (pre_nowarmup_lr0.001_s0)" in line
    assert _snapshot(out) == before
