"""Configuration: dataclass defaults, one flat YAML layer, then ``key=value`` CLI overrides.

Dataclasses hold the defaults and (in attribute docstrings) the documentation. Configs are
frozen: overriding builds new instances, nothing mutates a config it was handed. Unknown keys
and wrong types raise :class:`ConfigError` naming the key, the source and the expected type.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names key, source and expected form."""


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Valid choices ordered with the closest matches to ``name`` first."""
    choices = list(choices)
    near = difflib.get_close_matches(name, choices, n=n, cutoff=0.0)
    return near + [c for c in choices if c not in near]


def unknown_choice_message(kind: str, name: str, choices: Iterable[str]) -> str:
    ordered = closest(name, choices)
    return f"unknown {kind} {name!r}; valid choices (closest first): {', '.join(ordered)}"


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it converted (lists -> tuples, int -> float)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def fail() -> ConfigError:
        return ConfigError(f"{source}: key {key!r} expects {_type_name(tp)}, got {value!r} ({type(value).__name__})")

    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError:
                continue
        raise fail()
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{source}: key {key!r} must be one of {', '.join(map(repr, args))}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise fail()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{source}: key {key!r} expects {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]", source) for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise fail()
        return apply_overrides(tp(), value, source, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "1e6" (no dot) as a string; accept numeric strings for numeric fields.
        try:
            value = float(value)
        except ValueError:
            raise fail() from None
    if tp is int:
        if isinstance(value, bool):
            raise fail()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail()
    if tp is float:
        if isinstance(value, bool):
            raise fail()
        if isinstance(value, int | float):
            return float(value)
        raise fail()
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail()
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise fail()


def apply_overrides(cfg: T, overrides: Mapping[str, Any], source: str, prefix: str = "") -> T:
    """Return a copy of dataclass ``cfg`` with nested ``overrides`` applied and type-checked."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"expected a dataclass instance, got {type(cfg).__name__}")
    hints = typing.get_type_hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg) if f.init}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in names:
            raise ConfigError(
                f"{source}: unknown key {prefix + str(key)!r}; valid keys (closest first): "
                + ", ".join(prefix + c for c in closest(str(key), sorted(names)))
            )
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: key {prefix}{key!r} expects a mapping of sub-keys, got {value!r}")
            changes[key] = apply_overrides(current, value, source, prefix=f"{prefix}{key}.")
        else:
            changes[key] = _coerce(value, hints[key], prefix + key, source)
    try:
        return dataclasses.replace(cfg, **changes)
    except (ValueError, TypeError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{source}: {err}") from err


def parse_dotted(pairs: Iterable[str], source: str = "command line") -> dict[str, Any]:
    """Turn ``["algo.lr=3e-4", "num_envs=64"]`` into a nested dict; values are parsed as YAML."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{source}: override {pair!r} must look like key=value (e.g. algo.lr=3e-4)")
        dotted, raw = pair.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"{source}: cannot parse value of {dotted!r}: {err}") from err
        node = nested
        parts = dotted.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: {dotted!r} sets both a value and sub-keys")
        node[parts[-1]] = value
    return nested


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def to_plain(cfg: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists: a YAML-safe tree."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_plain(v) for v in cfg]
    return cfg


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right after each field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe(cfg: Any, prefix: str = "") -> list[tuple[str, str, str]]:
    """Rows ``(dotted key, current value, doc)`` for ``--help``-style listings."""
    rows: list[tuple[str, str, str]] = []
    docs = field_docs(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            rows.extend(describe(value, prefix=f"{prefix}{f.name}."))
        else:
            rows.append((prefix + f.name, repr(value), docs.get(f.name, "")))
    return rows
