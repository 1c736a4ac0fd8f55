"""A study as a file: recipes x a grid over dotted keys x seeds (`normlab study NAME`).

    name: wortsman                      # default: the file's stem
    description: one line for the report
    recipes:                            # recipe names/files, or variants of one
      - pre
      - {recipe: pre, name: pre_zloss, set: {optim.z_loss: 1.0e-4}}
    set: {model.n_layers: 12}           # dotted overrides for every run
    schedule: {warmup_steps: 0}         # the schedule section, for every run
    grid:                               # every combination is one grid point
      optim.lr: [3.0e-4, 1.0e-3, 3.0e-3]
      model.n_layers: [4, 8]
    size: model.n_layers                # the size axis (default: the first grid key but optim.lr)
    seeds: [0, 1]
    steps: 200
    jobs: 2
    protocol: {lr_sensitivity: true, margin: 0.1, claims: true}
    claims:                             # decided by SCIENCE.md 22 (launch.verdicts.decide)
      - {name: "z-loss lowers LR sensitivity", a: pre_zloss, b: pre,
         statistic: lr_sensitivity, expect: a_lower}
    looks: {spending: pocock, seeds: [3, 8]}   # optional: a plan of looks (SCIENCE.md 22.8)

A claim names two recipe labels, a statistic (loss_at_best_lr, lr_sensitivity, trained_range),
what it expects (a_lower, b_lower, equivalent, any) and optionally a size; a claim whose recipes
were not run is "not tested". Without `claims:` a study with protocol.claims true decides the
seed articles' claims (recipes/studies/articles.yaml). A recipe entry may carry its own
`seeds:` (an A/A study: one recipe under two names with disjoint seeds).

`looks:` pre-registers the verdicts' group-sequential plan (launch.stats.group_sequential): the
Lan-DeMets spending function (obrien_fleming or pocock) and the seeds per arm at each look, the
last being the most the study runs; `registered: false` records, honestly, a plan written down
after seeds were added. Each verdict then uses the nominal level of the look its seeds are at,
and says so when its seeds are not a planned look or lie past the plan.

Files live in recipes/studies/; a bare name finds them there. Unknown keys and impossible grids
are a ConfigError (one line naming the key and what is allowed); a dotted recipe key under
`grid:`, `set:`, `schedule:` or a recipe entry's `set:` that the recipe schema does not know
gets the recipe loader's "did you mean" (`config_key_problem`), before any other check of the
file; every run's config is validated before any training starts (launch.commands.study).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.launch.config.loader import (
    RECIPES_DIR,
    find_recipe,
    key_of,
    load_yaml,
    suggest,
    type_hints,
)
from normlab.launch.errors import ConfigError

if TYPE_CHECKING:  # the plan's boundaries need scipy: loaded when a study file has looks
    from normlab.launch.stats.group_sequential import Plan

STUDIES_DIR = RECIPES_DIR / "studies"
LR = "optim.lr"
KEYS = [
    "name",
    "description",
    "recipes",
    "set",
    "schedule",
    "grid",
    "size",
    "seeds",
    "steps",
    "jobs",
    "spike_window",
    "protocol",
    "claims",
    "looks",
]
RECIPE_KEYS = ["recipe", "name", "set", "seeds"]
ARTICLES = "articles"  # the study file whose claims are the seed articles' (the default claims)
# ladder_target: the size the ladder fits forecast (ladder.csv; launch.transfer.ladder)
PROTOCOL = {"lr_sensitivity": True, "margin": 0.1, "claims": True, "ladder_target": None}
# keys a study owns through its own fields: a grid or `set:` giving them is refused
OWNED = {
    "training.seed": "seeds",
    "training.steps": "steps",
    "run_dir": "the study's output directory",
    "name": "the recipe entry's name",
}


@dataclass
class StudyRecipe:
    label: str  # the run-name prefix and the recipe's name in the report
    path: Path
    overrides: list[str] = field(default_factory=list)
    seeds: list[int] | None = None  # this entry's own seeds (None: the study's)


@dataclass
class StudySpec:
    name: str
    recipes: list[StudyRecipe]
    grid: dict[str, list[Any]]  # dotted key -> values, in file order
    seeds: list[int]
    size: str | None = None
    steps: int | None = None
    overrides: list[str] = field(default_factory=list)
    jobs: int = 1
    spike_window: int | None = None
    protocol: dict[str, Any] = field(default_factory=lambda: dict(PROTOCOL))
    description: str = ""
    path: Path | None = None
    claims: list[Any] | None = None  # verdicts.Claim; None: the seed articles' (when deciding)
    looks: Plan | None = None  # the plan of looks the verdicts decide under (SCIENCE.md 22.8)

    def claims_to_decide(self) -> list[Any]:
        """The claims the report decides: the file's, else the seed articles' (protocol.claims),
        else none."""
        if not self.protocol["claims"]:
            return []
        if self.claims is not None:
            return self.claims
        return article_claims()


def is_study(name: str) -> bool:
    """A study file: an existing YAML file with a `recipes:` or `grid:` key, or a name in
    recipes/studies/ (recipes never have those keys)."""
    path = Path(name).expanduser()
    if path.is_file():
        try:
            data = load_yaml(path)
        except ConfigError:
            return False
        return "recipes" in data or "grid" in data
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    return bool(stem) and (STUDIES_DIR / f"{stem}.yaml").is_file()


def find_study(name: str) -> Path:
    path = Path(name).expanduser()
    if path.is_file():
        return path
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    if (STUDIES_DIR / f"{stem}.yaml").is_file():
        return STUDIES_DIR / f"{stem}.yaml"
    known = ", ".join(sorted(p.stem for p in STUDIES_DIR.glob("*.yaml")))
    raise ConfigError(f"no study file or study name {name!r}: studies: {known}")


def load_study(name: str) -> StudySpec:
    path = find_study(name)
    data = load_yaml(path)
    where = f"{path.name}: "
    for key in data:
        if key not in KEYS:
            hint = suggest(str(key), KEYS)
            raise ConfigError(
                f"{where}unknown study key {key!r}{hint}; study keys: {', '.join(KEYS)}"
            )
    overrides = _dotted(data.get("set") or {}, "set", where)
    schedule = data.get("schedule") or {}
    if not isinstance(schedule, dict):
        raise ConfigError(f"{where}'schedule' must be a mapping of schedule keys")
    timing = _dotted({f"schedule.{k}": v for k, v in schedule.items()}, "schedule", where)
    for item in timing:
        if any(o.partition("=")[0] == item.partition("=")[0] for o in overrides):
            key = item.partition("=")[0]
            raise ConfigError(f"{where}{key} is given by both 'set' and 'schedule'; give it once")
    overrides += timing
    grid = _grid(data.get("grid") or {}, where)
    protocol = dict(PROTOCOL)
    given = data.get("protocol") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"{where}'protocol' must be a mapping with keys {sorted(PROTOCOL)}")
    for key, value in given.items():
        if key not in PROTOCOL:
            raise ConfigError(f"{where}unknown key 'protocol.{key}'; allowed: {sorted(PROTOCOL)}")
        protocol[key] = value
    margin = protocol["margin"]
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin > 0:
        raise ConfigError(f"{where}protocol.margin must be a positive number, got {margin!r}")
    for key in ("lr_sensitivity", "claims"):
        if not isinstance(protocol[key], bool):
            raise ConfigError(f"{where}protocol.{key} must be true or false")
    target = protocol["ladder_target"]
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int | float) or not target > 0
    ):
        raise ConfigError(
            f"{where}protocol.ladder_target must be a size > 0 on the size axis, got {target!r}"
        )
    spec = StudySpec(
        name=str(data.get("name") or path.stem),
        description=str(data.get("description") or ""),
        recipes=_recipes(data.get("recipes"), where),
        grid=grid,
        seeds=_int_list(data.get("seeds", [0]), "seeds", where, low=0),
        size=data.get("size"),
        steps=_int(data.get("steps"), "steps", where),
        overrides=overrides,
        jobs=_int(data.get("jobs"), "jobs", where) or 1,
        spike_window=_int(data.get("spike_window"), "spike_window", where),
        protocol=protocol,
        path=path,
        claims=_claims(data, protocol, where),
        looks=None if data.get("looks") is None else _plan(data["looks"], where),
    )
    check_spec(spec, where)
    return spec


def _claims(data: dict[str, Any], protocol: dict[str, Any], where: str) -> list[Any] | None:
    from normlab.launch.verdicts.decide import claims_from_data

    if "claims" not in data:
        return None
    value = data["claims"]
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"{where}'claims' must be a non-empty list of {{a, b, statistic, expect, size, name}}"
        )
    if not protocol["claims"]:
        raise ConfigError(f"{where}claims are given but protocol.claims is false: drop one")
    return claims_from_data(value, f"{where}claims: ")


def article_claims() -> list[Any]:
    """The seed articles' claims: the `claims:` of recipes/studies/articles.yaml."""
    return load_study(ARTICLES).claims or []


def check_spec(spec: StudySpec, where: str = "") -> None:
    """The combinations a study cannot run (both from a file and from flags)."""
    set_keys = {o.partition("=")[0] for o in spec.overrides}
    for key in spec.grid:
        if key in set_keys:
            raise ConfigError(f"{where}grid.{key} is also given by set/--set: give it in one place")
        for r in spec.recipes:
            if key in {o.partition("=")[0] for o in r.overrides}:
                raise ConfigError(f"{where}grid.{key} is also set by recipe entry {r.label!r}")
    if spec.size is not None and (spec.size not in spec.grid or spec.size == LR):
        axes = [k for k in spec.grid if k != LR]
        raise ConfigError(
            f"{where}size must name a grid key other than {LR}, got {spec.size!r}; grid keys: "
            f"{axes or 'none'}"
        )
    if spec.size is None:
        spec.size = next((k for k in spec.grid if k != LR), None)
    if spec.protocol["lr_sensitivity"] and len(spec.grid.get(LR, [])) < 2:
        raise ConfigError(
            f"{where}the LR-sensitivity protocol needs grid.{LR} with at least 2 learning rates "
            "(or protocol.lr_sensitivity: false)"
        )
    if spec.looks is not None:
        most = max(len(r.seeds or spec.seeds) for r in spec.recipes)
        if most > spec.looks.seeds[-1]:
            raise ConfigError(
                f"{where}looks.seeds ends at {spec.looks.seeds[-1]} seeds per arm but a recipe "
                f"runs {most}: the plan's last look is the most seeds the study runs"
            )
    labels = [r.label for r in spec.recipes]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ConfigError(f"{where}recipes given twice: {', '.join(twice)} (name the variants)")


def _recipes(value: Any, where: str) -> list[StudyRecipe]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}'recipes' must be a non-empty list of recipe names or entries")
    out = []
    for entry in value:
        if isinstance(entry, str):
            path = find_recipe(entry)
            out.append(StudyRecipe(path.stem, path))
            continue
        if not isinstance(entry, dict) or "recipe" not in entry:
            raise ConfigError(
                f"{where}a recipes entry is a name or a mapping with keys {RECIPE_KEYS}, "
                f"got {entry!r}"
            )
        for key in entry:
            if key not in RECIPE_KEYS:
                raise ConfigError(
                    f"{where}unknown recipes entry key {key!r}; allowed: {RECIPE_KEYS}"
                )
        path = find_recipe(str(entry["recipe"]))
        label = str(entry.get("name") or path.stem)
        if not label.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{where}recipe entry name {label!r}: letters, digits, _ and - only")
        overrides = _dotted(entry.get("set") or {}, f"recipes.{label}.set", where)
        seeds = entry.get("seeds")
        if seeds is not None:
            seeds = _int_list(seeds, f"recipes.{label}.seeds", where, low=0)
        out.append(StudyRecipe(label, path, overrides, seeds))
    return out


def _section_of(hint: Any) -> type | None:
    """The dataclass a field's type holds (itself, or the dataclass of an Optional); None."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next((s for a in typing.get_args(hint) if (s := _section_of(a))), None)
    return None


def config_key_problem(key: str) -> str | None:
    """What is wrong with a dotted recipe key, in the recipe loader's words ("unknown key
    'optim.lrr' (did you mean 'optim.lr'?)"); None for a key the schema has. Keys under a
    mapping (instruments.NAME.KEY) are left to the run's own validation."""
    from normlab.launch.config.schema import RunConfig  # the model schema: imported on use

    section: type | None = RunConfig
    prefix = ""
    for part in key.split("."):
        if section is None:
            return None
        fields = {key_of(f): f for f in dataclasses.fields(section) if f.init}
        if part not in fields:
            return f"unknown key '{prefix}{part}'{suggest(part, list(fields), prefix)}"
        section = _section_of(type_hints(section)[fields[part].name])
        prefix += f"{part}."
    return None


def _known_key(key: str, what: str, where: str) -> None:
    problem = config_key_problem(key)
    if problem:
        raise ConfigError(f"{where}{what}: {problem}")


def _dotted(value: Any, what: str, where: str) -> list[str]:
    """{a.b: v} or nested {a: {b: v}} -> ['a.b=v', ...]; owned keys refused."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}'{what}' must be a mapping of dotted keys to values")
    flat: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, item in node.items():
            full = f"{prefix}{key}"
            if isinstance(item, dict) and item:
                walk(item, f"{full}.")
            elif full in flat:  # {a: {b: 1}, a.b: 2}: one setting written twice
                raise ConfigError(f"{where}{what}: {full} is given twice; give it once")
            else:
                flat[full] = item

    walk(value, "")
    for key in flat:
        if key in OWNED:
            raise ConfigError(f"{where}{what}: {key} is given by {OWNED[key]}")
        _known_key(key, what, where)
    return [f"{k}={json.dumps(v)}" for k, v in flat.items()]


def _grid(value: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}'grid' must map dotted keys to lists of values")
    out = {}
    for key, values in value.items():
        key = str(key)
        if key in OWNED:
            raise ConfigError(f"{where}grid.{key} is given by {OWNED[key]}, not by the grid")
        _known_key(key, "grid", where)
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}grid.{key} must be a non-empty list, got {values!r}")
        if any(isinstance(v, dict | list) for v in values):
            raise ConfigError(f"{where}grid.{key} values must be scalars, got {values!r}")
        if len({json.dumps(v) for v in values}) < len(values):
            raise ConfigError(f"{where}grid.{key} has a value twice: {values!r}")
        if key == LR:
            bad = [
                v
                for v in values
                if isinstance(v, bool)
                or not isinstance(v, int | float)
                or not (math.isfinite(v) and v > 0)
            ]
            if bad:
                raise ConfigError(f"{where}grid.{LR} must be positive numbers, got {bad[0]!r}")
        out[key] = values
    return out


def _int(value: Any, what: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}{what} must be an integer >= 1, got {value!r}")
    return value


def _int_list(value: Any, what: str, where: str, low: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}{what} must be a non-empty list of integers >= {low}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in value):
        raise ConfigError(f"{where}{what} must be integers >= {low}, got {value!r}")
    if len(set(value)) < len(value):
        raise ConfigError(f"{where}{what} has a value twice: {value!r}")
    return list(value)


def _plan(data: Any, where: str) -> Plan:
    """The study file's `looks:` as a plan (its import brings scipy: only when a study has one)."""
    from normlab.launch.stats.group_sequential import plan_from_data

    return plan_from_data(data, where)
