"""Per-domain validation losses reach the console, and a validation split smaller than one eval
pass is warned about (issue 30 item 6): a 2-source mixture trained for 4 steps (the tiny
fixtures), the eval line checked against metrics.jsonl, the warning's numbers against the
prepared splits; the boundary (one sequence short of a pass) on a stand-in loader."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from normlab.data.loader import PackedSource
from normlab.launch.config import load_config
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.training.evaluation import eval_text, small_val_warnings
from normlab.launch.training.trainer import Trainer
from rich.console import Console

from tests.conftest import REPO, tiny_overrides

PRE = REPO / "recipes" / "pre.yaml"
EVAL_BATCHES = 12  # x global batch 4 = 48 sequences: more than the arithmetic source's split


def test_two_domains_on_the_console_and_the_small_split_warned(
    tiny_data: Path, arith_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    over = [
        o
        for o in tiny_overrides(
            tiny_data, run, training__steps=4, training__eval_batches=EVAL_BATCHES,
            logging__progress=True,
        )
        if not o.startswith("data.dataset=")
    ]  # fmt: skip
    over.append(
        f"data.sources=[{{name: plays, path: '{tiny_data}', weight: 0.7}}, "
        f"{{name: arith, path: '{arith_data}', weight: 0.3}}]"
    )
    console = Console(record=True, width=400)
    assert Trainer(load_config(PRE, over), console=console).run() == 0
    text = console.export_text()
    have = {n: PackedSource(p, 64).num_sequences("val") for n, p in
            (("plays", tiny_data), ("arith", arith_data))}  # fmt: skip
    assert have["arith"] < EVAL_BATCHES * 4 <= have["plays"]  # the fixtures' sizes
    warning = (
        f"warning: data source 'arith': its validation split holds {have['arith']} sequences of "
        f"65 tokens, fewer than one eval pass (training.eval_batches {EVAL_BATCHES} x global "
        f"batch 4 = {EVAL_BATCHES * 4}): each eval uses {have['arith'] // 4} of {EVAL_BATCHES} "
        "batches"
    )
    assert warning in text and "data source 'plays'" not in text
    (row,) = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_loss" in r]
    line = next(x for x in text.splitlines() if "eval loss" in x)
    expected = (
        f"eval loss {row['eval_loss']:.4f} (plays {row['eval/plays']:.4f}, "
        f"arith {row['eval/arith']:.4f})"
    )
    assert line.endswith(expected), line
    numbers = [float(v) for v in re.findall(r"\d+\.\d{4}", line.split("eval loss")[1])]
    assert numbers[0] == pytest.approx(0.7 * numbers[1] + 0.3 * numbers[2], abs=2e-4)


def loader(*sizes: int, global_batch: int = 4) -> SimpleNamespace:
    sources = [SimpleNamespace(num_sequences=lambda split, n=n: n) for n in sizes]
    names = [f"s{i}" for i in range(len(sizes))]
    return SimpleNamespace(names=names, sources=sources, global_batch=global_batch, seq_len=64)


def test_one_sequence_short_of_an_eval_pass_is_warned() -> None:
    assert small_val_warnings(loader(32), 8) == []  # exactly one pass of 8 x 4
    (line,) = small_val_warnings(loader(32, 31), 8)
    assert line.startswith("warning: data source 's1': its validation split holds 31 sequences")
    assert line.endswith("= 32): each eval uses 7 of 8 batches")  # 31 // 4


def test_one_source_keeps_the_plain_eval_text() -> None:
    assert eval_text(5.12345, ["data"], [5.12345]) == "eval loss 5.1235"
    assert eval_text(5.0, ["a", "b"], [4.0, 6.5]) == "eval loss 5.0000 (a 4.0000, b 6.5000)"
