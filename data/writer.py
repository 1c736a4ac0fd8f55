"""Write tokenised documents as flat memory-mapped token arrays, one per split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm


def write_splits(
    tok: Any, is_val: np.ndarray, eos: np.ndarray, out_dir: Path, dtype: np.dtype, eos_id: int
) -> dict[str, int]:
    """Write `train.bin`/`val.bin` from the `ids` column of `tok` (a datasets.Dataset), appending
    `eos_id` after rows where `eos` is set; returns the token count per split."""
    lengths = np.asarray(tok.with_format("numpy")["n"], dtype=np.int64) + eos
    counts = {"train": int(lengths[~is_val].sum()), "val": int(lengths[is_val].sum())}
    arrays, cursor = {}, {"train": 0, "val": 0}
    for split, n in counts.items():
        # np.memmap refuses size 0; an empty split is an empty file.
        path = out_dir / f"{split}.bin"
        path.write_bytes(b"")
        arrays[split] = np.memmap(path, dtype=dtype, mode="w+", shape=(n,)) if n else None
    arrow = tok.select_columns(["ids"]).with_format("arrow")
    row, batch_rows = 0, 2048
    with tqdm(total=sum(counts.values()), unit="tok", unit_scale=True, desc="writing") as bar:
        for table in arrow.iter(batch_size=batch_rows):
            col = table.column("ids").combine_chunks()
            values, offsets = col.values.to_numpy(), col.offsets.to_numpy()
            for j in range(len(col)):
                r = row + j
                split = "val" if is_val[r] else "train"
                a, c = arrays[split], cursor[split]
                n = offsets[j + 1] - offsets[j]
                a[c : c + n] = values[offsets[j] : offsets[j + 1]]
                if eos[r]:
                    a[c + n] = eos_id
                cursor[split] = c + n + int(eos[r])
                bar.update(n + int(eos[r]))
            row += len(col)
    for split, a in arrays.items():
        if a is not None:
            a.flush()
        assert cursor[split] == counts[split], "token count mismatch while writing"
    return counts
