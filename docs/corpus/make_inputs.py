"""Inputs of the README's "your corpus" example, built in code (nothing is downloaded):
two domains and an existing tokenizer.

- plays.txt: the bundled corpus (Shakespeare's works);
- arith.txt: a generated domain, one `a + b = c` line each (sums correct by construction);
- tokenizer.json: a byte-level BPE tokenizer made with the `tokenizers` library over a sample of
  both (it stands in for the tokenizer.json of a model family that a user brings).

Requires: normlab installed as the README says (`pip install -e .`), which brings `tokenizers`
(a dependency of normlab since `prepare --tokenizer` reads tokenizer.json with it); nothing else.

Usage: python docs/corpus/make_inputs.py OUT_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

try:
    from normlab.data.corpus import bundled_corpus_path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as exc:  # run outside the install the README describes
    sys.exit(f"make_inputs.py needs normlab and tokenizers ({exc}): pip install -e . in the clone")

ARITH_LINES = 200_000
VOCAB = 2048


def arithmetic(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10_000), rng.randrange(10_000)
        op = rng.choice("+-")
        out.append(f"{a} {op} {b} = {a + b if op == '+' else a - b}\n")
    return "".join(out)


def byte_level_bpe(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [ln for t in texts for ln in t.splitlines(keepends=True)[:40_000]]
    tok.train_from_iterator(lines, trainer)
    return tok


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plays = bundled_corpus_path().read_text()
    arith = arithmetic(ARITH_LINES)
    (out / "plays.txt").write_text(plays)
    (out / "arith.txt").write_text(arith)
    byte_level_bpe([plays, arith]).save(str(out / "tokenizer.json"))
    for name in ("plays.txt", "arith.txt", "tokenizer.json"):
        print(f"{out / name}: {(out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
