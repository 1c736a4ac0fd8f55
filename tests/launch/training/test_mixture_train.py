"""Training on a mixture: per-domain validation (eval/<name>, weighted eval_loss) against a direct
cross-entropy of the final model, tokens per source in metrics and summary, `validate`'s epochs,
and resuming with another split of the same global batch (or refusing another global batch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from normlab.data.loader import PackedSource
from normlab.data.mixture import MixtureLoader, SourceSpec
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.errors import CheckpointError
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.trainer import Trainer

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"
W = (0.7, 0.3)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def _mixture(tiny: Path, arith: Path) -> str:
    return (
        f"data.sources=[{{name: plays, path: '{tiny}', weight: {W[0]}}}, "
        f"{{name: arith, path: '{arith}', weight: {W[1]}}}]"
    )


def _overrides(tiny: Path, arith: Path, run: Path, **kw: object) -> list[str]:
    over = [o for o in tiny_overrides(tiny, run, **kw) if not o.startswith("data.dataset=")]
    return [*over, _mixture(tiny, arith)]


@pytest.fixture(scope="module")
def mixed_run(tiny_data: Path, arith_data: Path, tmp_path_factory: pytest.TempPathFactory):
    run = tmp_path_factory.mktemp("mixed") / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(run.parent / "cache"))
    try:
        over = _overrides(tiny_data, arith_data, run, logging__tensorboard=True, optim__lr=0.01)
        trainer = Trainer(load_config(PRE, over))
        assert trainer.run() == 0
    finally:
        mp.undo()
    return trainer, run


def test_per_domain_eval_is_the_cross_entropy_of_each_val_split(mixed_run, tiny_data, arith_data):
    trainer, run = mixed_run
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8]
    for r in evals:
        assert r["eval_loss"] == pytest.approx(W[0] * r["eval/plays"] + W[1] * r["eval/arith"])
        assert r["eval/arith"] != pytest.approx(r["eval/plays"], rel=0.05)  # two domains
    model = trainer.engine.model.eval()
    for name, path in (("plays", tiny_data), ("arith", arith_data)):
        src = PackedSource(path, 64)
        with torch.no_grad():
            ce = [
                F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
                for x, y in src.iter_eval(2, 4, 0, 1)
            ]
        assert evals[-1][f"eval/{name}"] == pytest.approx(float(torch.stack(ce).mean()), rel=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_by_source"] == pytest.approx(
        {"plays": evals[-1]["eval/plays"], "arith": evals[-1]["eval/arith"]}
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(run / "tb")).Reload().Tags()["scalars"]
    assert {"eval/plays", "eval/arith", "eval/eval_loss", "tokens/arith"} <= set(tags)


def test_tokens_per_source_logged_and_in_summary(mixed_run, tiny_data, arith_data) -> None:
    _, run = mixed_run
    ref = MixtureLoader(
        [SourceSpec("plays", tiny_data, W[0]), SourceSpec("arith", arith_data, W[1])], 64, 4
    )
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    for r in rows:
        next(ref)
        assert {k: r[f"tokens/{k}"] for k in ("plays", "arith")} == ref.tokens_seen()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tokens_by_source"] == ref.tokens_seen()
    assert sum(summary["tokens_by_source"].values()) == 8 * 4 * 64


def test_validate_prints_epochs_and_warns_on_repeats(
    tiny_data: Path, arith_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    over = _overrides(tiny_data, arith_data, tmp_path / "v", training__steps=2000)
    assert main(["validate", str(PRE), *over, "--world-size", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    windows = {
        n: (json.loads((p / "meta.json").read_text())["tokens"]["train"] - 1) // 64
        for n, p in (("plays", tiny_data), ("arith", arith_data))
    }
    for name, w in zip(("plays", "arith"), W, strict=True):
        epochs = 2000 * 4 * 2 * w / windows[name]
        assert f"data {name}: p {w:.3f}, {windows[name]:,} training" in out
        assert f"the run takes {epochs:.2f} epochs of it" in out
        assert (f"warning: data source {name!r} repeats" in out) == (epochs > 1)
    assert "warning: data source 'arith' repeats" in out


def test_bad_sources_one_line(tiny_data: Path, arith_data: Path, tmp_path: Path, capsys) -> None:
    base = [o for o in tiny_overrides(tiny_data, tmp_path / "b") if "data.dataset=" not in o]
    dup = f"data.sources=[{{name: a, path: '{tiny_data}'}}, {{name: a, path: '{arith_data}'}}]"
    for bad, words in (
        (dup, "data.sources[1].name 'a' must be unique"),
        (f"data.sources=[{{name: a, path: '{tiny_data}', weight: -1}}]", "weight must be"),
        (f"data.sources=[{{name: a, path: '{tmp_path}'}}]", "not a prepared data directory"),
        (f"data.sources=[{{name: a, pth: '{tiny_data}'}}]", "unknown key 'data.sources[0].pth'"),
    ):
        assert main(["validate", str(PRE), *base, bad]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    both = [f"data.dataset={tiny_data}", f"data.sources=[{{name: a, path: '{tiny_data}'}}]"]
    assert main(["validate", str(PRE), *base, *both]) == 2
    assert "both set" in capsys.readouterr().err


def test_resume_with_another_split_of_the_global_batch(
    tiny_data: Path, arith_data: Path, tmp_path: Path
) -> None:
    """Global batch 4 as 1 x 4 (straight) and, from step 4, as 2 micro-batches of 2: the same
    sequences per step, so the losses agree to fp32 rounding; batch 2 alone is refused."""
    run = tmp_path / "run"
    over = _overrides(tiny_data, arith_data, run, optim__lr=0.01)
    assert Trainer(load_config(PRE, over)).run() == 0
    straight = {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}
    with pytest.raises(CheckpointError, match=r"data.batch_size=4 or training.grad_accum=2"):
        Trainer(load_config(PRE, [*over, "data.batch_size=2"]), from_step="4").run()
    split = [*over, "data.batch_size=2", "training.grad_accum=2"]
    assert Trainer(load_config(PRE, split), from_step="4").run() == 0
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}
    assert [resumed[s] for s in range(1, 5)] == [straight[s] for s in range(1, 5)]
    got, want = (np.array([d[s] for s in range(5, 9)]) for d in (resumed, straight))
    assert np.allclose(got, want, rtol=1e-5, atol=0), (got, want)


def test_compare_and_study_tables_show_each_domain(mixed_run, tmp_path: Path) -> None:
    import csv

    from normlab.launch.report.compare import compare
    from normlab.launch.study.report import group_table
    from rich.console import Console

    _, run = mixed_run
    last = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_loss" in r][-1]
    result = compare([run], tmp_path / "cmp", Console(width=400, record=True))
    row = result["rows"][0]
    assert row["dataset"] == "plays+arith"
    assert (row["eval/plays"], row["eval/arith"]) == (last["eval/plays"], last["eval/arith"])
    with (tmp_path / "cmp" / "compare.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert float(table[0]["eval/arith"]) == last["eval/arith"]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| eval loss | eval plays | eval arith |" in md
    assert (tmp_path / "cmp" / "eval_by_domain.png").stat().st_size > 10_000
    head, cells = group_table(result["rows"])
    assert head[-2:] == ["eval plays", "eval arith"]
    assert cells[0][-1] == f"{last['eval/arith']:.3f}"
