"""Write the site's generated pages from the code and the committed study outputs (no torch).

    python docs/gen_reference.py          # rewrite the pages
    python docs/gen_reference.py --check  # exit 1 naming each page that is stale

- docs/reference/recipe_keys.md: every recipe key (the typed sections of
  launch/config/schema.py, the model section through model/config.py's ModelConfig, and every
  instrument of launch/registry.py with its settings dataclass): dotted name, type, default,
  allowed values and one line of meaning, read from the field's comment in the source.
- docs/reference/commands.md: every command's `--help`, from launch/cli.py's parser.
- docs/findings.md: what the committed studies decided (docs/**/verdicts.json written by
  `normlab verdicts`, and the claims table of each study.md written by `normlab study`).

tests/test_docs_site.py fails when a committed page differs from what this script writes, and
when a recipe key has no meaning (give the field a trailing `# comment`).
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import io
import json
import os
import re
import sys
import tokenize
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
PYTHON = "{}.{}".format(*sys.version_info[:2])  # argparse's help layout changes between versions
REFERENCE = DOCS / "reference"


# ---------------------------------------------------------------- field comments from the source


def field_comments(cls: type) -> dict[str, str]:
    """{field: meaning} of a dataclass from its source: the comment trailing the field's line,
    else the comment lines right above it (a blank line or a statement ends them)."""
    module = sys.modules[cls.__module__]
    text = Path(module.__file__ or "").read_text()
    lines = text.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    node = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    out: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        end = stmt.end_lineno or stmt.lineno
        after = trailing.get(end) if not lines[end - 1].lstrip().startswith("#") else None
        if after and not after.startswith("fmt:"):
            out[name] = after
            continue
        above: list[str] = []
        row = stmt.lineno - 1
        while row >= 1 and lines[row - 1].lstrip().startswith("#"):
            above.insert(0, lines[row - 1].lstrip().lstrip("#").strip())
            row -= 1
        if above:
            out[name] = " ".join(above)
    return out


def heading_comment(cls: type, name: str) -> bool:
    """Whether the comment above `name` is a group heading (it names SCIENCE.md sections)."""
    text = field_comments(cls).get(name, "")
    return bool(re.fullmatch(r"[a-z -]+ \(SCIENCE\.md [0-9-]+\)", text))


# ---------------------------------------------------------------- types, defaults, allowed values


def type_text(tp: Any) -> tuple[str, list[Any]]:
    """(readable type, allowed values) of an annotation: Literal args are the allowed values."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        args = list(typing.get_args(tp))
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args)), args
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        names, allowed = [], []
        for arg in typing.get_args(tp):
            name, values = type_text(arg)
            names.append(name)
            allowed += values
        if allowed and "null" in names:
            allowed.append(None)
        return " | ".join(dict.fromkeys(names)), allowed
    if tp is type(None):
        return "null", []
    if origin is list:
        (arg,) = typing.get_args(tp)
        return f"list of {type_text(arg)[0]}", []
    if origin is tuple:
        return "[" + ", ".join(type_text(a)[0] for a in typing.get_args(tp)) + "]", []
    if origin is dict or tp is dict:
        return "mapping", []
    if dataclasses.is_dataclass(tp):
        return "mapping", []
    return getattr(tp, "__name__", str(tp)), []


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value) if abs(value) >= 1e-3 or value == 0 else f"{value:g}"
    return str(value)


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def inner_dataclass(tp: Any) -> tuple[type | None, bool]:
    """(the dataclass inside an annotation, whether it is a list of them)."""
    if dataclasses.is_dataclass(tp):
        return tp, False  # type: ignore[return-value]
    origin = typing.get_origin(tp)
    if origin is list:
        inner, _ = inner_dataclass(typing.get_args(tp)[0])
        return inner, True
    for arg in typing.get_args(tp) if origin is not typing.Literal else ():
        inner, many = inner_dataclass(arg)
        if inner is not None:
            return inner, many
    return None, False


# ---------------------------------------------------------------- recipe keys


@dataclasses.dataclass
class Key:
    name: str
    type: str
    default: str
    allowed: str
    meaning: str


def section_keys(cls: type, prefix: str) -> Iterator[Key]:
    """Every key of a section dataclass (nested sections and lists of them included)."""
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = prefix + f.metadata.get("key", f.name)
        tp = hints[f.name]
        shown, allowed = type_text(tp)
        default = default_of(f)
        inner, many = inner_dataclass(tp)
        yield Key(
            key,
            shown if inner is None else ("list of mappings" if many else "mapping"),
            "required" if default is dataclasses.MISSING else yaml_value(default),
            ", ".join(f"`{yaml_value(a)}`" for a in allowed),
            notes.get(f.name, ""),
        )
        if inner is not None:
            yield from section_keys(inner, f"{key}[]." if many else f"{key}.")


def model_keys() -> Iterator[Key]:
    """The model section: ModelSection's fields (preset, then ModelConfig's), with ModelConfig's
    types, defaults and comments (ModelSection's own comment wins)."""
    from normlab.launch.config.schema import ModelSection
    from normlab.model.config import ModelConfig

    config = {f.name: f for f in dataclasses.fields(ModelConfig)}
    hints = typing.get_type_hints(ModelConfig)
    own, theirs = field_comments(ModelSection), field_comments(ModelConfig)
    for f in dataclasses.fields(ModelSection):
        if f.name not in config:  # preset
            tp = typing.get_type_hints(ModelSection)[f.name]
            yield Key(f"model.{f.name}", type_text(tp)[0], "null", "", own.get(f.name, ""))
            continue
        shown, allowed = type_text(hints[f.name])
        mine = "" if heading_comment(ModelSection, f.name) else own.get(f.name, "")
        yield Key(
            f"model.{f.name}",
            shown,
            yaml_value(default_of(config[f.name])),
            ", ".join(f"`{yaml_value(a)}`" for a in allowed),
            mine or theirs.get(f.name, ""),
        )


def instrument_keys() -> Iterator[Key]:
    """instruments.<name> for every registered instrument (meaning: its class docstring), then
    its settings (launch.config.instruments)."""
    from normlab.launch.config.instruments import NoSettings, settings_class
    from normlab.launch.registry import INSTRUMENTS

    for name, target in INSTRUMENTS.items():
        yield Key(
            f"instruments.{name}",
            "bool | mapping",
            "false",
            "",
            class_summary(target),
        )
        cls = settings_class(name)
        if cls is not NoSettings:
            yield from section_keys(cls, f"instruments.{name}.")


def class_summary(target: str) -> str:
    """The first sentence of a class's docstring, read from its file (nothing is imported)."""
    import normlab.launch

    module, attr = target.split(":")
    rel = module.removeprefix("normlab.launch.").replace(".", "/") + ".py"
    path = Path(normlab.launch.__file__).parent / rel
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == attr:
            doc = " ".join((ast.get_docstring(node) or "").split())
            return re.split(r"(?<=[a-z)]\.)\s(?=[A-Z])", doc, maxsplit=1)[0].rstrip(".")
    return ""


def recipe_keys() -> list[Key]:
    from normlab.launch.config.schema import RunConfig

    keys: list[Key] = []
    hints = typing.get_type_hints(RunConfig)
    notes = field_comments(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name == "model":
            keys += model_keys()
        elif f.name == "instruments":
            keys += instrument_keys()
        elif dataclasses.is_dataclass(hints[f.name]):
            keys += section_keys(hints[f.name], f"{f.name}.")
        else:
            shown, allowed = type_text(hints[f.name])
            keys.append(Key(f.name, shown, yaml_value(default_of(f)), "", notes.get(f.name, "")))
    return keys


def cell(text: str) -> str:
    """A table cell: Python's None/True/False read as YAML's null/true/false."""
    text = re.sub(r"\bNone\b", "null", text)
    text = re.sub(r"\b(True|False)\b", lambda m: m.group(1).lower(), text)
    return text.replace("|", "\\|")


def recipe_keys_page() -> str:
    keys = recipe_keys()
    out = [
        "# Recipe keys",
        "",
        "<!-- generated by docs/gen_reference.py from launch/config/schema.py, model/config.py,",
        "     launch/config/instruments.py and launch/registry.py: do not edit -->",
        "",
        "Every key a recipe (or a `KEY=VALUE` override on the command line) can set, generated",
        "from the typed sections. A recipe may also name a `base:` recipe it inherits from. An",
        "unknown key, a wrong type or a value outside *allowed* is one line naming the key,",
        "exit 2. In the `model` section an unset key takes the `model.preset`'s value, else the",
        "default shown. An instrument is switched on with `true` or a mapping of its settings.",
        "",
    ]
    section = None
    for key in keys:
        top = key.name.split(".")[0] if "." in key.name else "run"
        if top != section:
            section = top
            out += [
                *([""] if out[-1] else []),
                f"## `{top}`" if top != "run" else "## Top level",
                "",
                "| key | type | default | allowed | meaning |",
                "|---|---|---|---|---|",
            ]
        out.append(
            f"| `{key.name}` | {cell(key.type)} | `{cell(key.default)}` | {cell(key.allowed)} "
            f"| {cell(key.meaning)} |"
        )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- commands


def commands_page() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal width: fix it
    os.environ["PYTHON_COLORS"] = "0"  # Python 3.14's argparse colours help on a terminal
    from normlab.launch.cli import build_parser

    parser = build_parser()
    out = [
        "# Commands",
        "",
        "<!-- generated by docs/gen_reference.py from launch/cli.py's parser: do not edit -->",
        f"<!-- argparse of Python {PYTHON} -->",
        "",
        "Every `normlab` command's `--help`. `KEY=VALUE` arguments override recipe keys",
        "([recipe keys](recipe_keys.md)). A user error is one line on stderr and exit status 2.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            out += [f"## `normlab {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- findings


def _seeds(study_dir: Path) -> str:
    data = (
        json.loads((study_dir / "study.json").read_text())
        if (study_dir / "study.json").exists()
        else {}
    )
    seeds = sorted({r.get("seed") for r in data.get("runs", []) if r.get("seed") is not None})
    return ", ".join(str(s) for s in seeds) if seeds else "-"


def _claims_table(study_md: Path) -> list[tuple[str, str, str]]:
    """(claim, verdict, evidence) of each row of the '## Verdicts' table of a study.md, by the
    table's own header (evidence: its 'evidence' or 'numbers' column, after 'why' if any)."""
    part = study_md.read_text().split("## Verdicts", 1)
    if len(part) < 2:
        return []
    table = [line for line in part[1].split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    if len(table) < 3:
        return []

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split(" | ")]

    head = cells(table[0])
    rows = []
    for line in table[2:]:
        row = dict(zip(head, cells(line), strict=False))
        evidence = [row[k] for k in ("why", "evidence", "numbers") if row.get(k, "-") != "-"]
        rows.append((row.get("claim", ""), row.get("verdict", ""), "; ".join(evidence)))
    return rows


def _rel(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


def findings_page() -> str:
    out = [
        "# What normlab found so far",
        "",
        "<!-- generated by docs/gen_reference.py from the committed study outputs under docs/:",
        "     do not edit -->",
        "",
        "Every verdict below is copied by the generator from a study's committed output, with the",
        "seeds it rests on; the study pages have every number and the figures. A verdict is no",
        "stronger than its seeds: a study's claim needs every seed of one side beyond every seed",
        "of the other, and `normlab verdicts` (SCIENCE.md 22) adds an interval, Holm's",
        "correction over the family and the seeds each undecided claim would need.",
        "",
    ]
    verdict_files = sorted(DOCS.glob("**/verdicts.json"))
    out += ["## Verdicts of `normlab verdicts` (SCIENCE.md 22)", ""]
    if not verdict_files:
        out += [
            "No study output holds a `verdicts.json` yet. `normlab verdicts RESULTS.csv --out DIR`",
            "writes one; this page is regenerated from them by `python docs/gen_reference.py`.",
            "",
        ]
    for path in verdict_files:
        out += verdicts_table(path)
    out += ["## Claims decided by `normlab study`", ""]
    undecided: list[str] = []
    for study_md in sorted(DOCS.glob("**/study.md")):
        if not (study_md.parent / "study.json").exists():
            continue  # a write-up, not the output of `normlab study`
        rows = _claims_table(study_md)
        if not rows:
            continue
        seeds = _seeds(study_md.parent)
        out += [
            f"### [`{_rel(study_md)}`]({_rel(study_md)}) (seeds {seeds})",
            "",
            "| claim | verdict | evidence |",
            "|---|---|---|",
        ]
        for claim, verdict, evidence in rows:
            out.append(f"| {claim} | {verdict} | {evidence} |")
            if "inconclusive" in verdict or "not tested" in verdict:
                undecided.append(
                    f"- {claim}: {verdict.strip('*')} (`{_rel(study_md)}`, seeds {seeds})"
                )
        out.append("")
    out += sensitivity_section()
    transfer, open_transfer = transfer_section()
    out += transfer
    undecided += open_transfer
    out += ["## What the committed studies cannot yet decide", ""]
    out += undecided or ["- every claim above is decided"]
    out += [
        "",
        "## Every results page",
        "",
    ]
    pages = sorted(p for p in DOCS.glob("*.md") if p.name.startswith(("study", "quickstart")))
    pages += sorted(DOCS.glob("study/**/study.md")) + sorted(DOCS.glob("probes/**/study.md"))
    pages += sorted(DOCS.glob("theory/*.md"))
    out += [f"- [`{_rel(p)}`]({_rel(p)}): {_title(p)}" for p in pages]
    return "\n".join(out) + "\n"


def verdicts_table(path: Path) -> list[str]:
    """One verdicts.json of `normlab verdicts`: each claim with its seeds, interval, and the
    seeds it would need (80% power); those still inconclusive or not tested are listed after."""
    from normlab.launch.verdicts.report import SHOWN

    rows = json.loads(path.read_text())
    out = [
        f"### `{_rel(path.parent)}`",
        "",
        "| A | B | size | statistic | verdict | seeds (A/B) | delta [interval] "
        "| seeds for 80% power |",
        "|---|---|---|---|---|---|---|---|",
    ]
    open_ = []
    for v in rows:
        lo, hi = (list(v.get("interval") or []) + [None, None])[:2]
        delta = v.get("delta")
        shown = "-" if delta is None else f"{delta:+.3f} [{_num(lo)}, {_num(hi)}]"
        verdict = SHOWN.get(v.get("verdict"), str(v.get("verdict")))
        needed = v.get("seeds_needed")
        out.append(
            f"| {v.get('a')} | {v.get('b')} | {v.get('size')} | {v.get('statistic')} "
            f"| {verdict} | {v.get('n_a', '-')}/{v.get('n_b', '-')} | {shown} "
            f"| {needed if needed is not None else '-'} |"
        )
        if v.get("verdict") in ("inconclusive", "not_tested"):
            open_.append(
                f"- {v.get('a')} vs {v.get('b')} [{v.get('size')}] {v.get('statistic')}: "
                f"{verdict} on {v.get('n_a', '-')}/{v.get('n_b', '-')} seeds"
                + (f" ({v['note']})" if v.get("note") else "")
            )
    out += ["", f"Not yet decided ({len(open_)} of {len(rows)}):", "", *open_, ""]
    return out


TRANSFER_SHOWN = {
    "transfers": "**transfers**",
    "does_not_transfer_up": "**does not transfer** (moves up)",
    "does_not_transfer_down": "**does not transfer** (moves down)",
}


SIZE_UNITS = {"model.n_layers": " blocks", "model.d_model": " (d_model)"}


def size_unit(study: str) -> str:
    """What a study's sizes count (' blocks', ' (d_model)'), from its file's size axis (load_study
    resolves the default); '' for a study whose file is gone."""
    from normlab.launch.errors import ConfigError
    from normlab.launch.study.spec import load_study

    try:
        axis = load_study(study).size
    except ConfigError:  # a committed report whose study file is gone
        return ""
    return SIZE_UNITS.get(axis, f" ({axis})") if axis else ""


def transfer_section() -> tuple[list[str], list[str]]:
    """Per study with a size ladder: whether each recipe's best learning rate transfers from the
    smallest to the largest size (transfer.csv, launch/transfer/transfer_verdict.py: the
    one-sample verdict on the per-seed shifts, SCIENCE.md 21.6 and 22), and the undecided ones."""
    out = [
        "## Does the best learning rate transfer? (SCIENCE.md 21.6)",
        "",
        "Per recipe, the shift of each seed's best learning rate from the ladder's smallest to its",
        "largest size in octaves (log2), their mean with its interval at the Holm level over the",
        "study's recipes, and the verdict against a margin of 0.5 octave (`transfer.csv`).",
        "",
    ]
    undecided = []
    for path in sorted(DOCS.glob("study/**/transfer.csv")):
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        if not rows:
            continue
        unit = size_unit(path.parent.name)
        out += [
            f"### [`{_rel(path.parent)}`]({_rel(path.parent / 'study.md')})",
            "",
            "| recipe | sizes | seeds | per-seed shifts | mean [interval] (level) | verdict "
            "| seeds needed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            shifts = " ".join(f"{float(x):+.2f}" for x in r["shifts_log2"].split())
            mean = f"{float(r['mean_log2']):+.2f}" if r["mean_log2"] else "-"
            interval = (
                f" [{float(r['lo']):+.2f}, {float(r['hi']):+.2f}] ({r['level']})" if r["lo"] else ""
            )
            verdict = TRANSFER_SHOWN.get(r["verdict"], r["verdict"])
            note = f" ({r['note']})" if r.get("note") and r["verdict"] != "inconclusive" else ""
            out.append(
                f"| {r['recipe']} | {r['small']} to {r['large']}{unit} | {r['seeds']} | {shifts} "
                f"| {mean}{interval} | {verdict}{note} | {r['seeds_needed'] or '-'} |"
            )
            if r["verdict"] not in TRANSFER_SHOWN:
                undecided.append(
                    f"- the best learning rate of {r['recipe']} from {r['small']} to "
                    f"{r['large']}{unit}: {r['verdict']}"
                    + (f" ({r['note']})" if r.get("note") else "")
                    + f" (`{_rel(path.parent)}`, seeds {r['seeds']})"
                )
        out.append("")
    return out, undecided


def sensitivity_section() -> list[str]:
    """Per study: each recipe's LR sensitivity, best loss and trained range (sensitivity.csv,
    written by `normlab study`), with the seeds; a gap between two recipes' per-seed spreads is
    what the rule needs before it calls one less sensitive."""
    import csv

    out = [
        "## LR sensitivity by study (SCIENCE.md 19)",
        "",
        "From each study's `sensitivity.csv`: the LR sensitivity (mean over the grid of the",
        "seed-mean curve minus its best; lower is less sensitive) with the per-seed mean +- sd,",
        "the best eval loss, and the learning rates where every seed trained. Two recipes whose",
        "per-seed ranges overlap are not told apart by their seeds.",
        "",
    ]
    for path in sorted(DOCS.glob("**/sensitivity.csv")):
        rows = list(csv.DictReader(path.open()))
        if not rows:
            continue
        page = path.parent / "study.md"
        out += [
            f"### [`{_rel(path.parent)}`]({_rel(page)})",
            "",
            "| recipe | size | LR sensitivity (seeds) | best loss | trains at (lr) | seeds | lrs |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            trained = (
                f"{r['trained_lr_low']} .. {r['trained_lr_high']}"
                if r.get("trained_lr_low")
                else "-"
            )
            out.append(
                f"| {r['recipe']} | {r['size']} | {r['lr_sensitivity']} "
                f"({r['lr_sensitivity_seed_mean']} +- {r['lr_sensitivity_seed_sd']}) "
                f"| {r['best_loss']} at {r['best_lr']} | {trained} | {r['seeds']} | {r['lrs']} |"
            )
        out.append("")
    return out


def _num(x: Any) -> str:
    return "-" if x is None else (f"{x:+.3f}" if isinstance(x, float) else str(x))


def _title(path: Path) -> str:
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    return first.lstrip("# ").strip()


# ---------------------------------------------------------------- main


def pages() -> dict[Path, str]:
    return {
        REFERENCE / "recipe_keys.md": recipe_keys_page(),
        REFERENCE / "commands.md": commands_page(),
        DOCS / "findings.md": findings_page(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(DOCS.parent)} is stale: run python docs/gen_reference.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
