"""study.md as named sections (issue 48 item 2; launch.study.sections): every committed report
reads back losslessly into the sections the report writes, and a section is replaced, removed or
inserted by name, the rest kept line for line."""

from __future__ import annotations

from pathlib import Path

import pytest
from normlab.launch.study.sections import (
    FIGURES,
    FOOTER,
    FP8,
    GRID,
    GROWTH,
    HEAD,
    OTHER,
    PROTOCOL,
    VERDICTS,
    Section,
    parse,
    read_report,
    render,
    section_of,
    with_section,
    write_report,
)

ROOT = Path(__file__).resolve().parents[3]
REPORTS = sorted(
    str(p.relative_to(ROOT))
    for p in [
        *(ROOT / "docs" / "study").rglob("study.md"),
        *(ROOT / "docs" / "probes").rglob("study.md"),
    ]
)


@pytest.mark.parametrize("report", REPORTS)
def test_committed_reports_read_back_losslessly(report: str, tmp_path: Path) -> None:
    text = (ROOT / report).read_text()
    sections = read_report(ROOT / report)
    assert render(sections) == text
    assert write_report(tmp_path / "study.md", sections).read_text() == text
    names = [s.name for s in sections]
    assert (
        names[0] == HEAD and names[-1] == FOOTER and names.count(GRID) <= 1
    )  # the default study: its table predates the heading
    assert sections[0].lines[0].startswith("# normlab study")
    assert all(s.lines for s in sections)


def test_the_sections_of_a_report_as_written() -> None:
    """fp8: protocol, grid, FP8, verdicts; completep_depth: the ladder fits and the transfer
    verdict belong to the protocol; aa: figures after the verdicts; the protocol keeps its own
    figures."""

    def names(name: str) -> list[str]:
        return [s.name for s in read_report(ROOT / "docs" / "study" / name / "study.md")]

    assert names("fp8") == [HEAD, PROTOCOL, GRID, FP8, VERDICTS, FOOTER]
    assert names("completep_depth") == [HEAD, PROTOCOL, GRID, FOOTER]
    assert names("aa") == [HEAD, PROTOCOL, GRID, VERDICTS, FIGURES, FOOTER]
    protocol = section_of(read_report(ROOT / "docs/study/completep_depth/study.md"), PROTOCOL)
    assert protocol is not None
    heads = [x for x in protocol.lines if x.startswith("## ")]
    assert [h.split(" (")[0].split("?")[0] for h in heads] == [
        "## LR sensitivity",
        "## Ladder fits",
        "## Does the best learning rate transfer",
    ]
    assert sum(x.startswith("![") for x in protocol.lines) >= 2


def test_replace_remove_insert_by_name() -> None:
    text = "# t\n\nSetting: s.\n\n## Every grid point\n\n| a |\n\n## Notes\n\nn\n\nEvery run: x\n"
    sections = parse(text)
    assert [s.name for s in sections] == [HEAD, GRID, OTHER, FOOTER]
    verdicts = Section(VERDICTS, ["## Verdicts (SCIENCE.md 22)", "", "v", ""])
    once = with_section(sections, verdicts, before=(FOOTER,))
    assert render(once) == text.replace(
        "Every run:", "## Verdicts (SCIENCE.md 22)\n\nv\n\nEvery run:"
    )
    assert with_section(once, verdicts, before=(FOOTER,)) == once  # replaced, not added twice
    fp8 = Section(FP8, ["## FP8 casts and outliers (instruments.fp8)", "", "f", ""])
    both = with_section(once, fp8, before=(VERDICTS, FOOTER))
    assert [s.name for s in both] == [HEAD, GRID, OTHER, FP8, VERDICTS, FOOTER]
    assert with_section(both, Section(FP8, []), before=(VERDICTS, FOOTER)) == once  # removed
    assert with_section(sections, Section(PROTOCOL, ["## LR sensitivity", ""]), None) == sections
    assert with_section(sections, Section(GROWTH, []), before=()) == sections  # nothing to add
    at_end = with_section(parse("# t\n"), verdicts, before=(FOOTER,))
    assert render(at_end) == "# t\n\n## Verdicts (SCIENCE.md 22)\n\nv\n"
