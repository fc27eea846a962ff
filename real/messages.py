"""ROS 2 message types, taken from ``rosbags``' bundled ROS 2 interface definitions.

The runtime builds outgoing messages as ``rosbags`` message instances (the transport-neutral
form): the DDS transport converts them into Cyclone DDS structs, the rclpy transport into
rclpy messages, and ``rosbags`` itself serializes them to the reference CDR bytes the tests
compare against. Incoming messages stay in whatever form the transport delivers; the runtime
reads them only by attribute paths (``pose.pose.position``), which all three forms share.

The definitions used are ROS 2 Humble's; the message types this package uses
(``nav_msgs/Odometry``, ``sensor_msgs/JointState``, ``std_msgs/*``) are identical in Jazzy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import numpy as np

from embodied.config import unknown_choice_message
from embodied.errors import EmbodiedError

# rosbags Nodetype values (rosbags.typesys.base.Nodetype): kept as ints so the field
# walkers below read like the definition tables they walk.
BASE, NAME, ARRAY, SEQUENCE = 1, 2, 3, 4

NUMPY_DTYPES: dict[str, type] = {
    "bool": np.bool_,
    "byte": np.uint8,
    "octet": np.uint8,
    "char": np.uint8,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "uint16": np.uint16,
    "int32": np.int32,
    "uint32": np.uint32,
    "int64": np.int64,
    "uint64": np.uint64,
    "float32": np.float32,
    "float64": np.float64,
}
"""ROS 2 primitive type -> numpy dtype of its arrays in ``rosbags`` messages."""


@cache
def typestore() -> Any:
    """The ``rosbags`` type store with ROS 2 Humble's message definitions."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE)


def check_type(type_name: str) -> str:
    """Return ``type_name`` (``pkg/msg/Type``) if known, else raise naming close matches."""
    store = typestore()
    if type_name not in store.fielddefs:
        raise EmbodiedError(unknown_choice_message("ROS 2 message type", type_name, sorted(store.fielddefs)))
    return type_name


@cache
def fields(type_name: str) -> tuple[tuple[str, tuple[int, Any]], ...]:
    """``((field name, (node kind, spec)), ...)`` of a message type, in declaration order."""
    return tuple(typestore().fielddefs[check_type(type_name)][1])


def dds_type_name(type_name: str) -> str:
    """``nav_msgs/msg/Odometry`` -> ``nav_msgs::msg::dds_::Odometry_`` (ROS 2's DDS type name)."""
    pkg, kind, name = check_type(type_name).split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def dds_topic_name(topic: str) -> str:
    """ROS 2 topic ``/cf/odom`` -> DDS topic ``rt/cf/odom`` (ROS 2's topic prefix)."""
    return "rt/" + topic.lstrip("/")


def _default(kind: int, spec: Any) -> Any:
    if kind == BASE:
        base, _bound = spec
        if base == "string":
            return ""
        if base == "bool":
            return False
        return NUMPY_DTYPES[base](0).item()
    if kind == NAME:
        return make(spec)
    (item_kind, item_spec), length = spec
    if item_kind == BASE and item_spec[0] in NUMPY_DTYPES:
        size = length if kind == ARRAY else 0
        return np.zeros(size, dtype=NUMPY_DTYPES[item_spec[0]])
    if kind == ARRAY:
        return [_default(item_kind, item_spec) for _ in range(length)]
    return []


def make(type_name: str, values: Mapping[str, Any] | None = None) -> Any:
    """A ``rosbags`` message of ``type_name``; unspecified fields are zero / empty.

    ``values`` is a nested mapping (``{"pose": {"pose": {"position": {"x": 1.0}}}}``); numeric
    arrays and sequences accept any array-like and are converted to the field's dtype.
    """
    values = dict(values or {})
    kwargs: dict[str, Any] = {}
    for name, (kind, spec) in fields(type_name):
        if name not in values:
            kwargs[name] = _default(kind, spec)
            continue
        value = values.pop(name)
        if kind == NAME and isinstance(value, Mapping):
            value = make(spec, value)
        elif kind in (ARRAY, SEQUENCE):
            (item_kind, item_spec), _length = spec
            if item_kind == BASE and item_spec[0] in NUMPY_DTYPES:
                value = np.asarray(value, dtype=NUMPY_DTYPES[item_spec[0]])
            elif item_kind == NAME:
                value = [make(item_spec, v) if isinstance(v, Mapping) else v for v in value]
            else:
                value = list(value)
        kwargs[name] = value
    if values:
        raise EmbodiedError(f"{type_name} has no field(s) {', '.join(sorted(values))}")
    return typestore().types[type_name](**kwargs)


def convert(message: Any, type_name: str, build: Callable[[str, dict[str, Any]], Any]) -> Any:
    """Rebuild a ``rosbags`` message in another library's form.

    ``build(type_name, values)`` creates one message from its field values; nested messages are
    converted first, numeric arrays become Python lists (what Cyclone's and rclpy's setters take).
    """
    values: dict[str, Any] = {}
    for name, (kind, spec) in fields(type_name):
        value = getattr(message, name)
        if kind == NAME:
            value = convert(value, spec, build)
        elif kind in (ARRAY, SEQUENCE):
            (item_kind, item_spec), _length = spec
            if item_kind == NAME:
                value = [convert(v, item_spec, build) for v in value]
            else:
                value = value.tolist() if isinstance(value, np.ndarray) else list(value)
        values[name] = value
    return build(type_name, values)


def serialize(message: Any, type_name: str) -> bytes:
    """Reference ROS 2 CDR bytes (little endian, with the 4-byte encapsulation header)."""
    return bytes(typestore().serialize_cdr(message, type_name))


def resolve_path(type_name: str, path: str) -> tuple[int, Any]:
    """The ``(kind, spec)`` of the field at dotted ``path`` inside ``type_name``.

    Raises :class:`EmbodiedError` naming the first unknown part and the valid field names.
    """
    kind, spec = NAME, check_type(type_name)
    for part in path.split(".") if path else []:
        if kind != NAME:
            raise EmbodiedError(f"{type_name}: {path!r} goes inside a non-message field before {part!r}")
        names = dict(fields(spec))
        if part not in names:
            raise EmbodiedError(f"{type_name}: {path!r}: " + unknown_choice_message("field", part, names))
        kind, spec = names[part]
    return kind, spec


def numeric_size(kind: int, spec: Any) -> int | None:
    """How many numbers :func:`to_vector` yields for a field; ``None`` for sequences (dynamic)."""
    if kind == BASE:
        return 1 if spec[0] in NUMPY_DTYPES else 0
    if kind == NAME:
        sizes = [numeric_size(k, s) for _, (k, s) in fields(spec)]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)
    if kind == SEQUENCE:
        return None
    (item_kind, item_spec), length = spec
    item = numeric_size(item_kind, item_spec)
    return None if item is None else item * length


def get_path(message: Any, path: str) -> Any:
    """Attribute access along a dotted path; works on rosbags, Cyclone and rclpy messages."""
    for part in path.split(".") if path else []:
        message = getattr(message, part)
    return message


def to_vector(value: Any) -> np.ndarray:
    """Flatten a numeric field to float64 ``[n]``: a struct's numeric fields in declaration order.

    ``geometry_msgs/Point`` -> ``[x, y, z]``; ``Quaternion`` -> ``[x, y, z, w]``; sequences and
    arrays as they are. Strings are skipped.
    """
    names = _STRUCT_FIELDS.get(type(value))
    if names is None and _is_message(value):
        names = _STRUCT_FIELDS[type(value)] = _field_names(value)
    if names is not None:
        items = [getattr(value, n) for n in names]
        # Fast path for the common all-scalar structs (Point, Quaternion, Vector3).
        if all(type(v) is float for v in items):
            return np.array(items, dtype=np.float64)
        parts = [to_vector(v) for v in items]
    elif isinstance(value, bool | int | float | np.number):
        return np.array([float(value)])
    elif isinstance(value, np.ndarray):
        return value.astype(np.float64).ravel()
    elif isinstance(value, str | bytes):
        return np.zeros(0)
    else:  # list, tuple, array.array (rclpy sequences)
        items = list(value)
        if items and isinstance(items[0], str):
            return np.zeros(0)  # name lists are not numbers (even when they look like them)
        try:
            return np.asarray(items, dtype=np.float64).ravel()
        except (TypeError, ValueError):  # nested messages
            parts = [to_vector(v) for v in items]
    return np.concatenate(parts) if parts else np.zeros(0)


_STRUCT_FIELDS: dict[type, list[str]] = {}


def _is_message(value: Any) -> bool:
    return hasattr(value, "__dataclass_fields__") or hasattr(type(value), "get_fields_and_field_types")


def _field_names(message: Any) -> list[str]:
    """Field names in declaration order of a rosbags dataclass, Cyclone struct or rclpy message."""
    fields_and_types = getattr(type(message), "get_fields_and_field_types", None)
    if fields_and_types is not None:  # rclpy
        return list(fields_and_types())
    dc_fields = getattr(message, "__dataclass_fields__", None)
    if dc_fields is not None:
        return [n for n in dc_fields if not n.startswith("_")]
    raise TypeError(f"cannot read fields of {type(message).__name__}")
