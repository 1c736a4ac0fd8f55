"""Generic typed loading: nested dicts -> dataclasses, YAML `base:` inheritance, dotted overrides.

Unknown keys are rejected with the closest valid key (full dotted name); a value of the wrong type
names its key and the expected type.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from normlab.launch.errors import ConfigError


def suggest(key: str, valid: list[str], prefix: str = "") -> str:
    """A ' (did you mean ...?)' hint naming the closest valid dotted key, or the valid keys."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return f" (did you mean '{prefix}{close[0]}'?)"
    return f"; valid keys under '{prefix.rstrip('.') or '<top>'}': {', '.join(sorted(valid))}"


def key_of(f: dataclasses.Field) -> str:
    """A field's recipe key: its name, or metadata["key"] where the key is a Python keyword
    (`checkpoint.async` is the field `async_`)."""
    return f.metadata.get("key", f.name)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)`, evaluated once per class (it compiles every string
    annotation on each call; do not mutate the mapping)."""
    return typing.get_type_hints(cls)


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, checking every key and value type."""
    where = prefix.rstrip(".") or "the config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}: {data!r}")
    fields = {key_of(f): f.name for f in dataclasses.fields(cls) if f.init}
    names = list(fields)
    hints = type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown key '{prefix}{key}'{suggest(str(key), names, prefix)}")
        kwargs[fields[key]] = coerce(value, hints[fields[key]], f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field without a default is missing
        raise ConfigError(f"{where}: {exc}") from None


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Check (and lightly convert: int -> float, '3e-4' -> float, list -> tuple) one value."""
    origin = get_origin(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return build(hint, value, key + ".")
    if origin is Literal:
        if value not in get_args(hint):
            allowed = ", ".join(repr(a) for a in get_args(hint))
            raise ConfigError(f"{key} must be one of {allowed}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, key)
    if origin in (tuple, list):
        return _coerce_sequence(value, hint, key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return {k: coerce(v, get_args(hint)[1], f"{key}.{k}") for k, v in value.items()}
    return _coerce_scalar(value, hint, key)


def _coerce_union(value: Any, hint: Any, key: str) -> Any:
    args = get_args(hint)
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{key} must not be null")
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return coerce(value, arg, key)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(" or ".join(errors) if len(errors) > 1 else errors[0])


def _coerce_sequence(value: Any, hint: Any, key: str) -> Any:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    args = get_args(hint)
    if get_origin(hint) is list:
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{key} must have {len(args)} entries, got {len(value)}: {value!r}")
    return tuple(
        coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
    )


def _coerce_scalar(value: Any, hint: type, key: str) -> Any:
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
            try:
                return _finite(float(value), key)
            except ValueError:
                pass
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _finite(float(value), key)
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ConfigError(f"{key} must fit in 64 bits (|value| <= 2**63 - 1), got {value}")
    if not isinstance(value, hint):
        raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}")
    return value


INT64_MAX = 2**63 - 1  # torch keeps steps, seeds and sizes as int64
FLOAT32_MAX = 3.4028234663852886e38  # a larger float is inf once it meets a float32 tensor


def _finite(value: float, key: str) -> float:
    """NaN and infinity are never a setting: they reach the optimizer or init as silent garbage,
    and so does a float beyond the float32 range (it turns into inf in the first tensor)."""
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if abs(value) > FLOAT32_MAX:
        raise ConfigError(
            f"{key} must be a finite number within the float32 range (|value| <= 3.4e38), "
            f"got {value!r}"
        )
    return value


def find_non_finite(data: Any, prefix: str = "") -> str | None:
    """The dotted key of the first NaN or infinite float anywhere in nested dicts/lists (the
    untyped sections, such as instrument settings, included), None when every float is finite."""
    if isinstance(data, float):
        return None if math.isfinite(data) else prefix.rstrip(".")
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list | tuple)
        else ()
    )
    for k, v in items:
        found = find_non_finite(v, f"{prefix}{k}.")
        if found is not None:
            return found
    return None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else in `over` replaces `base`."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# recipes/ at the top of the repository, or normlab/recipes in an installed wheel (pyproject.toml
# maps the folder there): two levels above launch/config/ in both layouts.
RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def find_recipe(name: str | Path) -> Path:
    """The recipe file `name` means, for every command that takes one: an existing file as given,
    else a name in recipes/ or recipes/presets/ (`pre`, `pre.yaml`, `7b`, `quickstart/pre`).
    A path-like name that matches nothing is returned as given (load_yaml names it missing)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    stem = str(name).removesuffix(".yaml").removesuffix(".yml")
    if stem and not Path(stem).is_absolute():
        for folder in (RECIPES_DIR, RECIPES_DIR / "presets"):
            if (folder / f"{stem}.yaml").is_file():
                return folder / f"{stem}.yaml"
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1 or path.is_dir():
        return path
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    known += sorted(p.stem for p in (RECIPES_DIR / "presets").glob("*.yaml"))
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"no recipe file or recipe name {str(name)!r}: {hint}recipes: {', '.join(known)}"
    )


def load_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe, resolving `base:` (a path or list of paths, relative to the file)."""
    path = Path(path).resolve()
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise ConfigError(f"circular 'base:' inheritance: {cycle}")
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    data = read_strict_yaml(path, "recipe")
    if data is None:
        raise ConfigError(
            f"{path}: the recipe is empty (write the sections it changes, or `base: FILE`)"
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a recipe must be a mapping at the top level, got {type(data).__name__}"
        )
    merged: dict[str, Any] = {}
    for base in _bases(path, data.pop("base")) if "base" in data else []:
        merged = deep_merge(merged, load_yaml(_base_path(path, base), (*_chain, path)))
    return deep_merge(merged, data)


def _base_path(path: Path, base: str) -> Path:
    """A `base:` entry of recipe `path`: a file relative to the recipe, else a shipped recipe's
    name (`base: pre`, `base: 7b`, as on the command line) from any directory and any install."""
    relative = (path.parent / base).expanduser()
    if relative.is_file():
        return relative
    stem = base.removesuffix(".yaml").removesuffix(".yml")
    if stem and not Path(stem).expanduser().is_absolute():
        for folder in (RECIPES_DIR, RECIPES_DIR / "presets"):
            if (folder / f"{stem}.yaml").is_file():
                return folder / f"{stem}.yaml"
    raise ConfigError(
        f"{path}: base {base!r} not found ({relative}, nor a recipe name in {RECIPES_DIR})"
    )


def _bases(path: Path, bases: Any) -> list[str]:
    """`base:` as a list of non-empty path strings, or one line naming what it holds instead."""
    items = [bases] if isinstance(bases, str) else bases
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: 'base' must be a path or a list of paths, got {bases!r}")
    for base in items:
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{path}: 'base' must be a path or a list of paths, got {base!r}")
    return items


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (a section written twice
    would otherwise silently keep only its second copy)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:
                continue  # an unhashable key: the base class names it
            if first is not None:
                problem = f"duplicate key {key!r} (first given on line {first})"
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> Any:
    """A document's parse, kept by its text: planning a study reads the same recipes once per
    run (pure-Python YAML: ~5 ms a file); a failed parse is not kept and raises each time."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)


def read_strict_yaml(path: Path, what: str) -> Any:
    """The YAML document in `path` (None when it holds nothing), refusing duplicate keys; any
    read or parse failure is one ConfigError line naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
        return copy.deepcopy(_parsed(text))  # the caller may change what it gets
    except UnicodeDecodeError as exc:
        where = f"{exc.reason} at byte {exc.start}"
        raise ConfigError(f"{path}: not a UTF-8 text file ({where})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {yaml_problem(exc)}") from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A parse error on one line: what is wrong and where (line, column), without the snippet."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{problem} at {where}" + (f" ({' '.join(context.split())})" if context else "")


def check_once(overrides: list[str], flag: str = "") -> None:
    """A setting given twice in one list (the same key, or a key and a section holding it, as
    `optim.lr=1e-3 optim.lr=2e-3` or `optim={lr: 1} optim.lr=2`) is refused in one line: the
    last one would win silently. `flag`: how the command line spells one (`--set `)."""
    seen: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0].strip()
        for other, first in seen.items():
            if key == other or key.startswith(other + ".") or other.startswith(key + "."):
                what = "twice" if key == other else f"with {other!r}, which holds it"
                if key != other and other.startswith(key + "."):
                    what = f"with {other!r}, which it holds"
                raise ConfigError(
                    f"setting {key!r} given {what} ({flag}{first!r}, {flag}{item!r}): give each "
                    "setting once"
                )
        seen[key] = item


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides; each value is parsed as YAML (so 3, 0.1, true, [0.9, 0.95])."""
    out = deep_merge({}, data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.load(raw, Loader=StrictLoader) if raw.strip() else None  # noqa: S506
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: value is not valid YAML") from None
        node = out
        parts = key.strip().split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"override {item!r}: '{'.'.join(parts[: i + 1])}' is not a section"
                )
            else:
                child = node[part] = dict(child)
            node = child
        node[parts[-1]] = value
    return out


def to_plain(obj: Any) -> Any:
    """Dataclasses/tuples -> plain dicts/lists that yaml.safe_dump and json accept."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {key_of(f): to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj
