"""Shared fixtures: a small prepared corpus (512-piece tokenizer) and tiny-model overrides."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Without CUDA the Triton kernel tests run through the interpreter, which must be on before triton
# is first imported: once torch.compile's inductor has imported it, kernels can no longer be
# interpreted (tests/model/test_kernels.py after tests/launch/engines/test_compile.py in one
# worker). The `auto`
# norm backend still picks torch on CPU; tests of the CPU refusal unset the variable.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"  # shared helpers and worker scripts live here, beside conftest.py
SLICE_LINES = 20000


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """One intra-op thread per test (a trainer may have set another): the suite runs two workers
    on two cores, and tiny models' backward passes slow down ~100x when OpenMP threads contend
    for a busy core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_GUARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


@pytest.fixture(autouse=True)
def signals_left_as_found() -> Iterator[None]:
    """A test that leaves a stop signal ignored, handled or blocked in this worker fails here:
    a SIG_IGN or a blocked mask passes to every child the worker starts later (a SIGTERM the
    child then never sees hung an unrelated test: a GracefulStop test restored one signal of
    three)."""
    before = [signal.getsignal(s) for s in _GUARDED], signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = [signal.getsignal(s) for s in _GUARDED], signal.pthread_sigmask(signal.SIG_BLOCK, [])
    changed = [s.name for s, b, a in zip(_GUARDED, before[0], after[0], strict=True) if a != b]
    assert not changed and after[1] == before[1], (
        f"the test left signal dispositions changed ({changed}) or the mask "
        f"{sorted(after[1])} (was {sorted(before[1])})"
    )


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A slice of the bundled corpus prepared once per session at vocab 512."""
    from normlab.data.corpus import bundled_corpus_path
    from normlab.data.prepare import prepare

    root = tmp_path_factory.mktemp("tiny_data")
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(root / "cache"))
    try:
        text = bundled_corpus_path().read_text()
    finally:
        mp.undo()
    src = root / "slice.txt"
    src.write_text("".join(text.splitlines(keepends=True)[:SLICE_LINES]))
    out = root / "prepared"
    prepare([str(src)], out, vocab_size=512, val_fraction=0.02, num_proc=1)
    return out


def tiny_overrides(data_dir: Path, run_dir: Path, **extra: object) -> list[str]:
    """Overrides that shrink any recipe to a 2-layer, d 64, seq 64 model on `data_dir`."""
    values: dict[str, object] = {
        "model.n_layers": 2,
        "model.d_model": 64,
        "model.n_heads": 2,
        "model.d_ff": 192,
        "model.vocab_size": 512,
        "model.max_seq_len": 64,
        "data.dataset": str(data_dir),
        "data.vocab_size": 512,
        "data.seq_len": 64,
        "data.batch_size": 4,
        "schedule.warmup_steps": 2,
        "training.steps": 8,
        "training.eval_every": 4,
        "training.eval_batches": 2,
        "training.log_every": 1,
        "training.device": "cpu",
        "training.threads": 1,
        "checkpoint.every": 4,
        "logging.progress": False,
        "logging.tensorboard": False,
        "run_dir": str(run_dir),
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


def arithmetic_lines(n: int, seed: int = 0) -> str:
    """A second domain generated in code: `a + b = c` lines (sums checked by construction)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        op = rng.choice("+-")
        out.append(f"{a} {op} {b} = {a + b if op == '+' else a - b}\n")
    return "".join(out)


@pytest.fixture(scope="session")
def arith_data(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arithmetic domain prepared with tiny_data's tokenizer (a two-source mixture)."""
    from normlab.data.prepare import prepare

    root = tmp_path_factory.mktemp("arith_data")
    src = root / "arith.txt"
    src.write_text(arithmetic_lines(1500))  # ~370 windows of 64: a few steps wrap it
    out = root / "prepared"
    tokenizer = str(tiny_data / "tokenizer.model")
    prepare([str(src)], out, tokenizer=tokenizer, val_fraction=0.1, num_proc=1)
    return out
