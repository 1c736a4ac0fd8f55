"""Generated verdict blocks in the README and docs: written from a study's verdicts.json.

A block in any Markdown file:

    <!-- normlab:verdicts docs/study/lr12 -->
    ... (generated: do not edit; `python -m normlab.launch.verdicts.doc_blocks FILE...`)
    <!-- /normlab:verdicts -->

holds the verdict table of the study directory named (relative to the repository root), built
from its verdicts.json (which `normlab study STUDY --report-only --out DIR` writes). `update`
rewrites every block of a file; `stale` lists the blocks that differ from what `render` gives
(tests/launch/study/test_committed_studies.py fails on any).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from normlab.launch.json_file import read_json

OPEN = re.compile(r"<!-- normlab:verdicts (\S+) -->")
CLOSE = "<!-- /normlab:verdicts -->"
SHOWN = {
    "a_lower": "A lower",
    "b_lower": "B lower",
    "equivalent": "equivalent",
    "inconclusive": "inconclusive",
    "not_tested": "not tested",
}


def _num(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):  # "inf" / "-inf" in verdicts.json
        return x
    assert isinstance(x, int | float)
    return f"{x:+.3f}" if math.isfinite(x) else "-"


def render(study_dir: Path) -> list[str]:
    """The block's lines: one row per verdict of study_dir/verdicts.json."""
    data = read_json(study_dir / "verdicts.json", "verdicts record")
    lines = [
        "| claim | A vs B (size) | statistic | verdict | expected | delta A-B [interval] | "
        "seeds per arm for 80% power |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in data:
        size = "" if v["size"] == "-" else f" ({v['size']})"
        if v["verdict"] == "not_tested" or v.get("delta") is None:
            numbers = "-"
        else:
            lo, hi = v["interval"]
            numbers = f"{_num(v['delta'])} [{_num(lo)}, {_num(hi)}] at level {v['level']:.3g}"
        seeds = f"n {v['n_a']}/{v['n_b']}"
        verdict = SHOWN[v["verdict"]]
        if v["verdict"] == "inconclusive" and v.get("note"):
            verdict += f" ({seeds}; {v['note'].split(' for 80%')[0]})"
        elif v["verdict"] != "not_tested":
            verdict += f" ({seeds}; {v['meaning']})" if v.get("meaning") else f" ({seeds})"
        else:
            verdict += f" ({v.get('note') or 'not run'})"
        expect = SHOWN.get(v["expect"], v["expect"])
        need = "-" if v.get("seeds_needed") is None else str(v["seeds_needed"])
        lines.append(
            f"| {v.get('claim') or '-'} | {v['a']} vs {v['b']}{size} | {v['statistic']} | "
            f"{verdict} | {expect} | {numbers} | {need} |"
        )
    return lines


def _blocks(text: str) -> list[tuple[int, int, str]]:
    """(first body line, closing line, study dir) of every block, by line index."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = OPEN.fullmatch(lines[i].strip())
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == CLOSE), None)
            if end is None:
                raise ValueError(f"line {i + 1}: {lines[i].strip()} has no {CLOSE}")
            out.append((i + 1, end, m.group(1)))
            i = end
        i += 1
    return out


def rendered(path: Path, root: Path) -> str:
    """The file's text with every block rendered from its study's verdicts.json."""
    text = path.read_text()
    lines = text.split("\n")
    for start, end, study in reversed(_blocks(text)):
        lines[start:end] = render(root / study)
    return "\n".join(lines)


def stale(path: Path, root: Path) -> list[str]:
    """The study dirs whose block in `path` differs from its rendering."""
    text = path.read_text()
    lines = text.split("\n")
    return [
        study for start, end, study in _blocks(text) if lines[start:end] != render(root / study)
    ]


def update(path: Path, root: Path) -> bool:
    """Rewrite the file's blocks; True when it changed."""
    new = rendered(path, root)
    if new == path.read_text():
        return False
    path.write_text(new)
    return True


def main(argv: list[str]) -> int:
    root = Path.cwd()
    for name in argv:
        changed = update(Path(name), root)
        print(f"{name}: {'rewritten' if changed else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
