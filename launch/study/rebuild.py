"""`normlab study STUDY --report-only --out DIR`: a finished study's report without training.

From DIR/runs/<run> when every planned run is there (the full report), else from DIR/results.csv,
else from DIR/compare.csv (what the studies committed before results.csv keep); see
launch.study.study_verdicts for what each source gives. study.md is read back as its named
sections (launch.study.sections); the sections the table determines (verdicts, LR-sensitivity
protocol, FP8, the Setting line's merges) are built again by the report's own builders and the
list is written by the report's one writer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.launch.errors import ConfigError
from normlab.launch.study.fp8_section import fp8_section
from normlab.launch.study.merge import read_json, setting_with_merges
from normlab.launch.study.sections import (
    FOOTER,
    FP8,
    HEAD,
    VERDICTS,
    Section,
    read_report,
    with_section,
    write_report,
)
from normlab.launch.study.study_verdicts import (
    RESULTS_CSV,
    carries_metrics,
    committed_rows,
    decide_study,
    print_decided,
    protocol_csv,
    results_rows,
    verdict_section,
    write_verdicts,
)
from normlab.launch.verdicts.aa_simulation import B_DEFAULT

STALE_LOGITS = (
    "lr_logits.png not redrawn after the merge: {} of the {} runs have no log Z in {} (a table "
    "written before results.csv carried the runs' metrics), so it still shows the runs it was "
    "first drawn from"
)

if TYPE_CHECKING:
    from normlab.launch.study.spec import StudySpec
    from rich.console import Console


def rebuild(
    spec: StudySpec,
    out: Path,
    console: Console,
    aa: int = B_DEFAULT,
    plateau: float | None = None,
) -> dict[str, Any]:
    """`normlab study STUDY --report-only`: the report of a finished study, without training.
    `plateau`: the data's unigram loss when known (else read from the study's data).
    Returns {'decided': Decided, 'source': 'runs' | 'compare.csv', 'seconds': deciding time}."""
    from normlab.launch.study.plan import plan
    from normlab.launch.study.report import study_plateau

    planned = plan(spec, out)
    have_runs = all(
        (Path(str(p.cfg.run_dir)) / "summary.json").is_file() for p in planned if p.cfg.run_dir
    )
    if plateau is None:
        plateau = study_plateau([p.cfg.to_dict() for p in planned], spec)
    if have_runs:
        from normlab.launch.study.run import report_runs

        found = report_runs(spec, planned, out, console, plateau)
        return {"decided": found["decided"], "source": "runs", "seconds": found["seconds"]}
    source = RESULTS_CSV if (out / RESULTS_CSV).is_file() else "compare.csv"
    if not (out / source).is_file():
        raise ConfigError(
            f"--report-only: {out} has neither the study's runs ({out}/runs/...) nor its "
            f"{RESULTS_CSV} or compare.csv: run the study first"
        )
    read = results_rows if source == RESULTS_CSV else committed_rows
    rows, notes = read(planned, out)
    if not rows:
        raise ConfigError(f"--report-only: no run of study {spec.name} is in {out}/{source}")
    start = time.perf_counter()
    decided = decide_study(
        rows, spec.claims_to_decide(), plateau, spec.protocol["margin"], aa, source, spec.looks
    )
    seconds = time.perf_counter() - start
    decided.notes += notes
    has_claims = bool(spec.claims_to_decide())  # a study without claims has no verdict files
    if has_claims:
        write_verdicts(decided, out)
    curves, stale = None, ""
    record = read_json(out / "study.json")  # what --merge joined (study.json's `merged`)
    if spec.protocol["lr_sensitivity"]:
        curves = protocol_csv(rows, spec.protocol["margin"], plateau, out)
        if curves is None:
            decided.notes.append("sensitivity.csv not rewritten: l_0 unknown")
        else:  # the figures from the same curves; lr_logits.png only from a complete table
            from normlab.launch.report.plots import save
            from normlab.launch.study.lr_plots import logits_figure, loss_figure

            save(loss_figure(curves), out / "lr_loss.png")
            if carries_metrics(rows):
                save(logits_figure(curves), out / "lr_logits.png")
            elif record.get("merged"):  # runs joined that it lacks
                stale = STALE_LOGITS.format(
                    sum(not carries_metrics([r]) for r in rows), len(rows), source
                )
                decided.notes.append(stale)
    growth = None
    if spec.claims is None and spec.protocol["claims"] and plateau is not None:
        from normlab.launch.verdicts.growth_claims import CLAIMS, decide_all

        growth = decide_all(rows, plateau, CLAIMS)
    if (out / "study.md").is_file():  # the sections the table determines, written again
        sections = read_report(out / "study.md")
        if has_claims:
            verdicts = Section(VERDICTS, verdict_section(decided, growth))
            sections = with_section(sections, verdicts, before=(FOOTER,))
        if curves:  # the protocol's table and the size ladder from the committed losses
            from normlab.launch.study.report import protocol_section

            margin, target = spec.protocol["margin"], spec.protocol.get("ladder_target")
            protocol = protocol_section(curves, margin, out, target, spec.looks, stale=stale)
            sections = with_section(sections, protocol, before=None)
        fp8 = Section(FP8, fp8_section(planned, out / "compare.csv"))
        sections = with_section(sections, fp8, before=(VERDICTS, FOOTER))
        sections = [_with_merges(s, record) if s.name == HEAD else s for s in sections]
        write_report(out / "study.md", sections)
    print_decided(decided, console, seconds)
    return {"decided": decided, "source": source, "seconds": seconds}


def _with_merges(head: Section, record: dict[str, Any]) -> Section:
    """The head section with its Setting line saying what `--merge` joined (study.json's
    `merged`; launch.study.merge.setting_with_merges), rewritten from the first run's part."""
    lines = [setting_with_merges(x, record) if x.startswith("Setting: ") else x for x in head.lines]
    return Section(HEAD, lines)
