"""Issue 47, items 3 and 6: every command's --out goes through the one checked output path
(launch/out_path.py). For every command that writes a folder and every fault of the place it is
given (a file, a path below a file, a read-only folder, a folder holding a user's files), the
command answers one line naming --out, exits 2 and leaves every file as it was; and every default
output folder is one .gitignore ignores and --help names."""

from __future__ import annotations

import argparse
import fnmatch
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from normlab.launch.cli import build_parser, main

from tests.conftest import REPO
from tests.launch.test_bad_inputs import hashes, make_results, make_run


def _args(root: Path) -> dict[str, Callable[[Path], list[str]]]:
    """command -> its arguments with --out OUT, on inputs that are valid."""
    run = make_run(root / "in")
    table, _ = make_results(root / "in")
    return {
        "compare": lambda out: ["compare", str(run), "--out", str(out)],
        "warnings": lambda out: ["warnings", str(run), "--out", str(out)],
        "verdicts": lambda out: ["verdicts", str(table), "--out", str(out)],
        "theory": lambda out: ["theory", "--out", str(out)],
        "coordcheck": lambda out: ["coordcheck", "pre", "--out", str(out)],
        "study": lambda out: ["study", "pre", "--steps", "1", "--out", str(out)],
        "quickstart": lambda out: ["quickstart", "--out", str(out)],
        "export": lambda out: ["export", str(run), "--out", str(out)],
        "prepare": lambda out: ["prepare", "--vocab-size", "300", "--out", str(out)],
    }


COMMANDS = ["compare", "warnings", "verdicts", "theory", "coordcheck", "study", "quickstart"]
COMMANDS += ["export", "prepare"]


def onto_a_file(root: Path) -> Path:
    (root / "notes.txt").write_text("a user's notes\n")
    return root / "notes.txt"


def below_a_file(root: Path) -> Path:
    (root / "notes.txt").write_text("a user's notes\n")
    return root / "notes.txt" / "report"


def read_only(root: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder: chmod cannot make one here")
    (root / "locked").mkdir()
    (root / "locked").chmod(0o555)
    return root / "locked" / "report"


def user_folder(root: Path) -> Path:
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("\\documentclass{article}\n")
    (root / "mine" / "compare.md").write_text("my own notes called compare.md\n")
    return root / "mine"


FAULTS = {
    "onto a file": onto_a_file,
    "below a file": below_a_file,
    "read-only": read_only,
    "a user's folder": user_folder,
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_out_is_one_line_and_nothing_is_lost(
    command: str, fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tmp_path)[command]
    place = tmp_path / "place"
    place.mkdir()
    try:
        out = FAULTS[fault](place)
        before = hashes(tmp_path)
        capsys.readouterr()
        code = main(args(out))
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"--out {out}" in err, err  # names the flag and the path given
        assert hashes(tmp_path) == before  # nothing written, nothing overwritten
    finally:
        for p in place.rglob("*"):
            if p.is_dir():
                p.chmod(0o755)


def _out_defaults() -> dict[str, str | None]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if "--out" in action.option_strings:
                found[name] = action.default
    return found


def _ignored(path: str) -> bool:
    """Whether the repository's .gitignore ignores `path` (a relative folder)."""
    patterns = [ln.strip() for ln in (REPO / ".gitignore").read_text().splitlines()]
    parts = Path(path).parts
    for pattern in (p for p in patterns if p and not p.startswith("#")):
        anchored, bare = pattern.startswith("/"), pattern.strip("/")
        heads = [parts[0]] if anchored else list(parts)
        if any(fnmatch.fnmatchcase(head, bare) for head in heads):
            return True
    return False


def test_default_outputs_are_ignored_by_git_and_named_in_help() -> None:
    defaults = _out_defaults()
    assert {"compare", "warnings", "verdicts", "theory", "coordcheck"} <= set(defaults)
    for command, default in defaults.items():
        if default is None:
            continue  # required (export) or computed (study: below)
        assert _ignored(str(default)), (command, default)
        parser_help = next(
            a.help
            for a in next(
                s for s in build_parser()._actions if isinstance(s, argparse._SubParsersAction)
            )
            .choices[command]
            ._actions
            if "--out" in a.option_strings
        )
        assert str(default).split("<")[0] in (parser_help or ""), (command, parser_help)
    for study_default in ("study", "studies/wortsman"):  # `normlab study`'s computed default
        assert _ignored(study_default), study_default


def test_a_study_folder_takes_its_reports(tmp_path: Path) -> None:
    """A folder holding plan.json or study.json is normlab's study folder, not a user's: reports
    may be rewritten there (`normlab compare RUNS --out STUDY_DIR`), as `normlab study` does."""
    from normlab.launch.out_path import WRITES, OutDirError, check_out_dir

    study = tmp_path / "study"
    (study / "runs").mkdir(parents=True)
    with pytest.raises(OutDirError, match="holds files this command does not write"):
        check_out_dir(study, writes=WRITES["compare"])
    for mark in ("plan.json", "study.json"):
        (study / mark).write_text("{}\n")
        check_out_dir(study, writes=WRITES["compare"])
        (study / mark).unlink()
