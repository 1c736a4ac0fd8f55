"""study.md as a list of named sections, written by one writer (issue 48 item 2).

The study's report (launch.study.report) builds every section from its results table and the
runs; `--report-only` (launch.study.rebuild) reads the written study.md back as sections, builds
again the sections the results table determines (the LR-sensitivity protocol, the FP8 section,
the verdicts, the Setting line's merges) and writes the list again with `write_report`. The
sections only the runs can give (the per-grid-point table, the figures, notes written by hand)
are kept as they were read: a rebuild from results.csv or compare.csv has no runs to make them.

    sections = read_report(out / "study.md")
    sections = with_section(sections, Section(VERDICTS, lines), before=(FOOTER,))
    write_report(out / "study.md", sections)

Reading is lossless: `render(read_report(path)) == path.read_text()` for any text, so a rebuild
that changes no section writes the file back byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HEAD = "head"  # the title, the Setting line and anything before the first section below
PROTOCOL = "protocol"  # LR sensitivity (SCIENCE.md 19), the ladder fits, the transfer verdict
GRID = "grid"  # every grid point over seeds
FP8 = "fp8"  # FP8 casts and outliers (launch.study.fp8_section)
VERDICTS = "verdicts"  # the claims decided by SCIENCE.md 22
GROWTH = "growth"  # the descriptive growth claims
FIGURES = "figures"  # the study's loss and depth figures
FOOTER = "footer"  # "Every run: ..."
OTHER = "other"  # a heading the report does not write (kept as read)

# the first line of each section, as the report writes it; the protocol's first heading is
# followed in the same section by the ladder's and the transfer verdict's
STARTS = {
    PROTOCOL: "## LR sensitivity",
    GRID: "## Every grid point",
    FP8: "## FP8 casts and outliers",
    VERDICTS: "## Verdicts",
    GROWTH: "## Growth claims",
    FOOTER: "Every run:",
}
PROTOCOL_MORE = ("## Ladder fits", "## Does the best learning rate transfer")


@dataclass(frozen=True)
class Section:
    """One named part of study.md: its lines, joined with newlines (a section ends with its
    blank line, as the report writes it); no lines: the section is left out."""

    name: str
    lines: list[str]


def render(sections: Iterable[Section]) -> str:
    """study.md's text: every section's lines in order, joined by newlines."""
    return "\n".join(line for s in sections for line in s.lines)


def write_report(path: Path, sections: Iterable[Section]) -> Path:
    """The one writer of study.md, for the report and for `--report-only` alike."""
    path.write_text(render(sections))
    return path


def _starts(line: str, current: str) -> str | None:
    """The section that `line` opens after a line of section `current` (None: it continues)."""
    if current == PROTOCOL and line.startswith(PROTOCOL_MORE):
        return None
    for name, start in STARTS.items():
        if line.startswith(start):
            return name
    if line.startswith("## "):
        return OTHER
    if line.startswith("![") and current not in (PROTOCOL, FIGURES):
        return FIGURES  # the protocol's own figures stay in the protocol
    return None


def parse(text: str) -> list[Section]:
    """A study.md's text as sections: a section starts at one of STARTS, at any other "## "
    heading (OTHER) or at a figure after a section other than the protocol (FIGURES)."""
    found: list[tuple[str, list[str]]] = [(HEAD, [])]
    for line in text.split("\n"):
        name = _starts(line, found[-1][0])
        if name is not None:
            found.append((name, []))
        found[-1][1].append(line)
    return [Section(name, lines) for name, lines in found if lines]


def read_report(path: Path) -> list[Section]:
    """A written study.md as its sections."""
    return parse(path.read_text())


def with_section(
    sections: list[Section], section: Section, before: tuple[str, ...] | None = ()
) -> list[Section]:
    """The sections with the first one named like `section` replaced by it (an empty one
    removes it). Where there is none: inserted before the first section named in `before`
    (at the end when none is there or `before` is empty), not at all when `before` is None or
    `section` is empty."""
    at = next((i for i, s in enumerate(sections) if s.name == section.name), None)
    if at is not None:
        return [*sections[:at], *([section] if section.lines else []), *sections[at + 1 :]]
    if before is None or not section.lines:
        return list(sections)
    at = next((i for i, s in enumerate(sections) if s.name in before), len(sections))
    return [*sections[:at], section, *sections[at:]]


def section_of(sections: list[Section], name: str) -> Section | None:
    """The first section named `name`, None when there is none."""
    return next((s for s in sections if s.name == name), None)
