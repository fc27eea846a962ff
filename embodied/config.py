"""Configuration: dataclass defaults, one flat YAML layer, then ``key=value`` CLI overrides.

Dataclasses hold the defaults and (in attribute docstrings) the documentation. Configs are
frozen: overriding builds new instances, nothing mutates a config it was handed. Unknown keys
and wrong types raise :class:`ConfigError` naming the key, the source and the expected type.

Every number that enters a config is checked where it enters (:func:`check_number`): NaN is
never accepted, infinity only where the field's default is infinite, and magnitudes must lie in
the range :data:`NUMERIC_BOUNDS` gives for the dotted key (a generic bound otherwise), so an
absurd value fails at once, naming the key and its source, instead of hanging the run,
overflowing an allocation or diverging every episode. Upper bounds a user could truly want to
exceed are lifted per key with ``--i-know-what-im-doing KEY``.

Text is bounded before it is parsed (:data:`MAX_CONFIG_BYTES`, :data:`MAX_YAML_DEPTH`,
:data:`MAX_NUMBER_DIGITS`) and read by :class:`StrictYamlLoader`: YAML's safe loader with
decimal numbers only (``0x10``, ``0o17``, ``1_000``, ``1:30`` and ``010`` are text, not numbers),
``true``/``false`` as the only booleans (YAML 1.1's ``yes``/``on``/``y`` are text), no dates, no
anchors or aliases, and no ``!!python/...`` tags (no object is ever built from a file).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import fnmatch
import inspect
import itertools
import math
import re
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names key, source and expected form."""


MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB; the shipped ones are under 4 kB)."""
MAX_YAML_DEPTH = 32
"""Deepest nesting of mappings and lists accepted in YAML text (configs nest 4 levels)."""
MAX_NUMBER_DIGITS = 64
"""Most digits in one numeric literal: far more than a float carries (17), far fewer than
Python's 4,300-digit limit on ``int`` conversion, which would otherwise surface as a traceback."""

DECIMAL_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
"""An integer literal as configs write it: decimal, no leading zeros (YAML 1.1 reads ``010`` as 8)."""
DECIMAL_FLOAT = re.compile(r"[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
"""A decimal number: ``3``, ``0.5``, ``.5``, ``1e6``, ``1.0e-5``; no hex, octal, ``_`` or ``:``."""
SPECIAL_FLOAT = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
"""YAML's spellings of infinity and NaN (the range check decides where they are accepted)."""
NAMED_FLOAT = re.compile(r"[-+]?(?:\.?inf(?:inity)?|\.?nan)", re.IGNORECASE)
"""``inf``/``nan`` as text in a numeric field: read as floats, so the range check names them."""


def _too_many_digits(text: str) -> bool:
    return sum(ch.isdigit() for ch in text) > MAX_NUMBER_DIGITS


class StrictYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without YAML 1.1's surprises, bounded in depth and number size.

    Scalars resolve to ``int`` only when decimal (:data:`DECIMAL_INT`), to ``float`` when
    decimal (:data:`DECIMAL_FLOAT`) or ``.inf``/``.nan``, to ``bool`` only for ``true``/``false``,
    to ``None`` for ``null``/``~``/nothing; everything else is a string. Errors are
    ``yaml.YAMLError`` with the position, as for any malformed YAML."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not accepted in configs", mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_decimal_int(self, node: yaml.ScalarNode) -> int:
        text = self.construct_scalar(node)
        if _too_many_digits(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(text)} characters (at most {MAX_NUMBER_DIGITS} digits)", node.start_mark
            )
        return int(text)

    def construct_decimal_float(self, node: yaml.ScalarNode) -> float:
        text = self.construct_scalar(node)
        if _too_many_digits(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(text)} characters (at most {MAX_NUMBER_DIGITS} digits)", node.start_mark
            )
        lowered = text.lower()
        if lowered.endswith(".inf"):
            return -math.inf if lowered.startswith("-") else math.inf
        if lowered.endswith(".nan"):
            return math.nan
        return float(text)


# PyYAML matches implicit resolvers with re.match: each pattern below ends in \Z. Null and the
# rest are kept; YAML 1.1's bool, int, float, timestamp and merge forms are replaced or dropped.
StrictYamlLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag.rsplit(":", 1)[-1] not in ("bool", "int", "float", "timestamp", "merge")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z"), list("tTfF")
)
StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(f"(?:{DECIMAL_INT.pattern})\\Z"), list("-+0123456789")
)
StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(f"(?:{DECIMAL_FLOAT.pattern}|{SPECIAL_FLOAT.pattern})\\Z"),
    list("-+0123456789."),
)
StrictYamlLoader.add_constructor("tag:yaml.org,2002:int", StrictYamlLoader.construct_decimal_int)
StrictYamlLoader.add_constructor("tag:yaml.org,2002:float", StrictYamlLoader.construct_decimal_float)
for _tag in ("timestamp", "binary", "omap", "pairs", "set"):
    # data types no config field holds: refused like any unknown tag
    StrictYamlLoader.yaml_constructors.pop(f"tag:yaml.org,2002:{_tag}", None)


def load_yaml_text(text: str) -> Any:
    """Parse ``text`` with :class:`StrictYamlLoader`; raises ``yaml.YAMLError``."""
    # StrictYamlLoader derives from yaml.SafeLoader: no !!python tag can construct an object
    return yaml.load(text, Loader=StrictYamlLoader)


@dataclasses.dataclass(frozen=True)
class Bound:
    """Allowed closed range of a numeric config value; ``overridable``: ``--i-know-what-im-doing``
    lifts the upper bound (for limits that only guard against hangs and huge allocations).

    A ``physical`` bound (declared with the field, :func:`ranged`) is the range in which the
    quantity is plausible for the robots this toolkit simulates, in ``unit``; both of its ends
    are lifted by ``--allow-unphysical`` (all keys) or ``--i-know-what-im-doing KEY`` (one key)."""

    low: float
    high: float
    overridable: bool = True
    why: str = ""
    unit: str = ""
    physical: bool = False


RANGE_METADATA = "range"
"""Dataclass field metadata key of a field's :class:`Bound` (set by :func:`ranged`)."""

UNPHYSICAL = "unphysical"
"""The entry of an ``allow`` collection (and of a saved config's ``i_know_what_im_doing`` list)
that ``--allow-unphysical`` adds: every physical range is lifted."""


def ranged(default: Any, low: float, high: float, unit: str = "", why: str = "", angle: bool = False) -> Any:
    """A dataclass field whose plausible values lie in ``[low, high]`` (in ``unit``; every
    element of a tuple default alike), checked wherever a config is loaded (:func:`check_number`).

    Declared next to the field so the range, its unit and the default are read together; the
    range must hold the published values of every vehicle the defaults describe (the
    Crazyflie 2.x) with room for other robots of its kind, and no more: a value outside it is
    a typo or a unit slip, not an experiment (``--allow-unphysical`` for deliberate ones).

    ``angle``: the value passes through ``cos``/``sin``, so outside ``[low, high]`` it wraps to
    another angle inside it (a tilt limit of 1000 rad acts as 56 degrees); no flag lifts it."""
    if not low <= high:
        raise ValueError(f"ranged: low {low} above high {high}")
    if angle and not why:
        why = "an angle through cos/sin: outside this interval it wraps to another angle"
    bound = Bound(low, high, overridable=not angle, why=why, unit=unit, physical=True)
    return dataclasses.field(default=default, metadata={RANGE_METADATA: bound})


def field_bound(f: dataclasses.Field[Any]) -> Bound | None:
    """The :class:`Bound` declared with field ``f`` (:func:`ranged`), or None."""
    bound = f.metadata.get(RANGE_METADATA)
    return bound if isinstance(bound, Bound) else None


GENERIC_FLOAT_BOUND = Bound(-1e9, 1e9, why="no physical or training quantity here is that large")
GENERIC_INT_BOUND = Bound(-(2**53), 2**53, why="larger integers lose precision as floats")

NUMERIC_BOUNDS: dict[str, Bound] = {
    "seed": Bound(0, 2**31 - 1, overridable=False, why="seeds must fit every RNG (numpy: < 2**32 after offsets)"),
    "num_envs": Bound(1, 262_144, why="one batch that large exhausts memory"),
    "trainer.total_env_steps": Bound(1, 10**12, why="beyond any run this toolkit can finish"),
    "trainer.eval_every_env_steps": Bound(0, 10**12),
    "trainer.eval_episodes": Bound(0, 1_000_000, why="an evaluation that long looks like a hang"),
    "trainer.log_every_updates": Bound(1, 10**9),
    "trainer.checkpoint_every_updates": Bound(1, 10**9),
    "trainer.torch_threads": Bound(0, 1024),
    "*substeps": Bound(1, 1000, why="each control step would take seconds"),
    "*episode_steps": Bound(0, 10**7),
    "*action_history": Bound(0, 10_000),
    "*num_steps_per_env": Bound(1, 100_000, why="the rollout buffer would exhaust memory"),
    "*num_epochs": Bound(1, 10_000),
    "*num_minibatches": Bound(1, 10**7),
    "*batch_size": Bound(1, 10**7, why="the batch would exhaust memory"),
    "*buffer_size": Bound(1, 10**9, why="the replay buffer would exhaust memory"),
    "*_hidden": Bound(1, 65_536, why="a layer that wide exhausts memory"),
    "*learning_starts": Bound(0, 10**12),
}
"""Ranges by dotted key (``fnmatch`` patterns; a tuple entry ``key[i]`` is checked as ``key``).
Keys not listed get :data:`GENERIC_FLOAT_BOUND` / :data:`GENERIC_INT_BOUND`; a dataclass's own
``__post_init__`` checks the finer physical rules (positive masses, stable step sizes)."""


def bound_for(key: str, value: int | float) -> Bound:
    """The :class:`Bound` for dotted ``key`` (``[i]`` suffixes ignored)."""
    base = key.split("[", 1)[0]
    for pattern, bound in NUMERIC_BOUNDS.items():
        if fnmatch.fnmatchcase(base, pattern):
            return bound
    return GENERIC_INT_BOUND if isinstance(value, int) else GENERIC_FLOAT_BOUND


def check_number(
    key: str,
    value: Any,
    default: Any,
    source: str,
    allow: Collection[str] = (),
    declared: Bound | None = None,
) -> None:
    """Raise :class:`ConfigError` unless every number in ``value`` (a number or a tuple of them) is
    finite and inside its range: the field's ``declared`` :class:`Bound` (:func:`ranged`) and
    :func:`bound_for`'s. Infinity passes only where ``default`` (the same position of the field's
    current value) is infinite too; ``allow`` holds the dotted keys whose bounds
    ``--i-know-what-im-doing`` lifted (an overridable upper bound, a physical range) and
    :data:`UNPHYSICAL` when ``--allow-unphysical`` lifted every physical range."""
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            item_default = default[i] if isinstance(default, tuple) and i < len(default) else None
            check_number(f"{key}[{i}]", item, item_default, source, allow, declared)
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float) and not math.isfinite(value):
        default_inf = isinstance(default, float) and math.isinf(default)
        if math.isnan(value) or not default_inf:
            raise ConfigError(f"{source}: key {key!r} must be a finite number, got {value!r}")
        return
    base = key.split("[", 1)[0]
    lifted_range = declared is not None and declared.overridable and (base in allow or UNPHYSICAL in allow)
    if declared is not None and not lifted_range and not declared.low <= value <= declared.high:
        unit = f" {declared.unit}" if declared.unit else ""
        why = f" ({declared.why})" if declared.why else ""
        hint = (
            f"; for a deliberate experiment add --allow-unphysical (or --i-know-what-im-doing {base})"
            if declared.overridable
            else ""
        )
        raise ConfigError(
            f"{source}: key {key!r} = {value!r}{unit} is outside its plausible range "
            f"[{_fmt(declared.low)}, {_fmt(declared.high)}]{unit}{why}{hint}"
        )
    bound = bound_for(key, value)
    lifted = bound.overridable and base in allow
    if value < bound.low or (value > bound.high and not lifted):
        hint = ""
        if value > bound.high:
            hint = f" ({bound.why})" if bound.why else ""
            if bound.overridable:
                hint += f"; to really use it add --i-know-what-im-doing {base}"
        low, high = (_fmt(b) for b in (bound.low, bound.high))
        raise ConfigError(f"{source}: key {key!r} must be in [{low}, {high}], got {value!r}{hint}")


def _fmt(number: float) -> str:
    if float(number).is_integer() and abs(number) < 1e16:
        return str(int(number))
    return f"{number:.6g}"


def check_numbers(cfg: Any, source: str, allow: Collection[str] = (), prefix: str = "") -> None:
    """:func:`check_number` on every numeric field of dataclass ``cfg``, recursively (the
    defaults and anything set without :func:`apply_overrides`)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_numbers(value, source, allow, prefix=f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
            check_number(prefix + f.name, value, default, source, allow, field_bound(f))


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Valid choices ordered with the closest matches to ``name`` first."""
    choices = list(choices)
    near = difflib.get_close_matches(name, choices, n=n, cutoff=0.0)
    return near + [c for c in choices if c not in near]


def unknown_choice_message(kind: str, name: str, choices: Iterable[str]) -> str:
    ordered = closest(name, choices)
    return f"unknown {kind} {name!r}; valid choices (closest first): {', '.join(ordered)}"


def _type_name(tp: Any) -> str:
    """An annotation as the user writes values in YAML: ``true/false or 'auto'``, ``float or null``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in args)
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true/false"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, source: str, allow: Collection[str] = ()) -> Any:
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
                return _coerce(value, arg, key, source, allow)
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
        return apply_overrides(tp(), value, source, prefix=f"{key}.", allow=allow)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp in (int, float) and isinstance(value, str):
        # A quoted number ('1e6'): decimal literals only, as in YAML text (no 0x10, 1_000, inf).
        text = value.strip()
        if not (DECIMAL_FLOAT.fullmatch(text) or NAMED_FLOAT.fullmatch(text)) or _too_many_digits(text):
            raise fail()
        value = float(text.replace(".", "") if NAMED_FLOAT.fullmatch(text) else text)
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


def apply_overrides(
    cfg: T, overrides: Mapping[str, Any], source: str, prefix: str = "", allow: Collection[str] = ()
) -> T:
    """Return a copy of dataclass ``cfg`` with nested ``overrides`` applied, type- and range-checked
    (:func:`check_number`; ``allow``: keys whose upper bound ``--i-know-what-im-doing`` lifted)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"expected a dataclass instance, got {type(cfg).__name__}")
    hints = typing.get_type_hints(type(cfg))
    fields = {f.name: f for f in dataclasses.fields(cfg) if f.init}
    names = set(fields)
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
            changes[key] = apply_overrides(current, value, source, prefix=f"{prefix}{key}.", allow=allow)
        else:
            changes[key] = _coerce(value, hints[key], prefix + key, source, allow)
            check_number(prefix + key, changes[key], current, source, allow, field_bound(fields[key]))
    try:
        return dataclasses.replace(cfg, **changes)
    except ConfigError as err:
        # A dataclass's own __post_init__ check does not know where its values came from.
        if str(err).startswith(f"{source}:"):
            raise
        raise ConfigError(f"{source}: {err}") from err
    except (ValueError, TypeError, ArithmeticError) as err:
        raise ConfigError(f"{source}: {err}") from err


def parse_dotted(pairs: Iterable[str], source: str = "command line") -> dict[str, Any]:
    """Turn ``["algo.lr=3e-4", "num_envs=64"]`` into a nested dict; values are parsed as YAML."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{source}: override {pair!r} must look like key=value (e.g. algo.lr=3e-4)")
        dotted, raw = pair.split("=", 1)
        try:
            value = load_yaml_text(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"{source}: cannot parse value of {dotted!r}: {' '.join(str(err).split())}") from None
        except RecursionError:
            raise ConfigError(f"{source}: cannot parse value of {dotted!r}: nested too deeply") from None
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
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {size} bytes, larger than any config (at most {MAX_CONFIG_BYTES} bytes)")
        data = load_yaml_text(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(err).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
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
            doc = docs.get(f.name, "")
            bound = field_bound(f)
            if bound is not None:
                unit = f" {bound.unit}" if bound.unit else ""
                doc = f"{doc} Plausible range [{_fmt(bound.low)}, {_fmt(bound.high)}]{unit}.".strip()
            rows.append((prefix + f.name, repr(value), doc))
    return rows


def _decimal_flag(text: str) -> float | None:
    """``text`` as a finite decimal number (:data:`DECIMAL_FLOAT`, at most
    :data:`MAX_NUMBER_DIGITS` digits), else None: no hex, ``_``, ``inf`` or ``nan``."""
    if not DECIMAL_FLOAT.fullmatch(text.strip()) or _too_many_digits(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _flag_error(expected: str, text: str) -> argparse.ArgumentTypeError:
    shown = text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"
    return argparse.ArgumentTypeError(f"expected {expected}, got {shown!r}")


def int_in_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type=``: a decimal integer in ``[low, high]`` (``1e3`` accepted; ``0x10``,
    ``1_000`` not), else a one-line usage error."""

    def parse(text: str) -> int:
        number = _decimal_flag(text)
        value = int(number) if number is not None and number.is_integer() else None
        if value is None or not low <= value <= high:
            raise _flag_error(f"an integer in [{low}, {high}]", text)
        return value

    parse.__name__ = "integer"
    return parse


def float_in_range(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """An argparse ``type=``: a finite decimal number in ``[low, high]`` (``unit`` names it in
    the error; ``0x10``, ``1_000``, ``inf`` and ``nan`` refused), else a one-line usage error."""

    def parse(text: str) -> float:
        value = _decimal_flag(text)
        if value is None or not low <= value <= high:
            suffix = f" {unit}" if unit else ""
            raise _flag_error(f"a number in [{_fmt(low)}, {_fmt(high)}]{suffix}", text)
        return value

    parse.__name__ = "number"
    return parse


DEVICE_PATTERN = r"cpu|cuda(:[0-9]{1,3})?"
"""What ``device`` / ``--device`` accept."""


def device_flag(text: str) -> str:
    """An argparse ``type=`` for ``--device``: ``cpu``, ``cuda`` or ``cuda:N``."""
    if not re.fullmatch(DEVICE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text
