"""Read an ONNX file's graph, weights and metadata from its protobuf bytes, without ``onnx``.

The robot-side runtime must install beside a ROS 2 Python's numpy (Humble: 1.21.5), and the
``onnx`` and ``onnxruntime`` wheels of today require a newer one. An exported MLP policy is a
few ``Gemm`` layers and element-wise operators whose weights sit in the ONNX file's
initializers, so this module decodes just the protobuf messages those need (``ModelProto``,
``GraphProto``, ``NodeProto``, ``AttributeProto``, ``TensorProto``, ``ValueInfoProto``; field
numbers from onnx's ``onnx.proto``) with numpy alone. Reading the very file the exporter checked
against torch and onnxruntime, rather than a second weights file, leaves one artifact that can
neither drift from its twin nor need another hash.

:func:`graph_sha256_of` recomputes ``policy_io.json``'s ``model_sha256`` (the definition in
:func:`embodied.policy_io.graph_sha256`) from the same bytes: an attribute's hashed form is its
serialized message, which is exactly the slice of the file it was read from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embodied.errors import EmbodiedError

# TensorProto.DataType -> numpy dtype (the numeric ones an exported policy can hold).
TENSOR_DTYPES: dict[int, type] = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}

# Wire types of the protobuf encoding.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class OnnxWireError(EmbodiedError):
    """The bytes are not an ONNX model this reader understands."""


class MetadataNotTextError(OnnxWireError):
    """A metadata entry is not UTF-8 (a damaged file)."""


@dataclass(frozen=True)
class Attribute:
    name: str
    value: float | int | bytes | tuple[float, ...] | tuple[int, ...] | None
    serialized: bytes
    """The attribute's message bytes as stored (what ``model_sha256`` hashes)."""


@dataclass(frozen=True)
class Node:
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[Attribute, ...]
    domain: str = ""

    def attr(self, name: str, default: float | int | None = None) -> float | int | None:
        for a in self.attributes:
            if a.name == name and isinstance(a.value, int | float):
                return a.value
        return default


@dataclass(frozen=True)
class Initializer:
    name: str
    data_type: int
    dims: tuple[int, ...]
    array: np.ndarray


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: ``shape`` entries are ints or symbolic names (like onnxruntime's)."""

    name: str
    shape: list[int | str]


@dataclass
class OnnxModel:
    nodes: list[Node] = field(default_factory=list)
    initializers: dict[str, Initializer] = field(default_factory=dict)
    inputs: list[ValueInfo] = field(default_factory=list)
    outputs: list[ValueInfo] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise OnnxWireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """``[(field number, wire type, value)]`` of one message; length-delimited values as bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _FIXED64:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == _FIXED32:
            value, pos = data[pos : pos + 4], pos + 4
        elif wire == _BYTES:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise OnnxWireError(f"unsupported protobuf wire type {wire} (field {number})")
        if pos > len(data):
            raise OnnxWireError(f"field {number} runs past the end of its message")
        out.append((number, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated integer field's entries from one occurrence (packed or not)."""
    if wire == _VARINT:
        assert isinstance(value, int)
        return [_signed(value)]
    assert isinstance(value, bytes)
    items, pos = [], 0
    while pos < len(value):
        item, pos = _varint(value, pos)
        items.append(_signed(item))
    return items


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise OnnxWireError("expected a string field")
    return value.decode("utf-8", errors="replace")


def _tensor(data: bytes) -> Initializer:
    name, data_type, dims = "", 0, []
    raw: bytes | None = None
    floats: list[bytes] = []
    doubles: list[bytes] = []
    int32s: list[int] = []
    int64s: list[int] = []
    for number, wire, value in _fields(data):
        if number == 1:
            dims += _ints(wire, value)
        elif number == 2 and isinstance(value, int):
            data_type = value
        elif number == 8:
            name = _text(value)
        elif number == 9 and isinstance(value, bytes):
            raw = value
        elif number == 4 and isinstance(value, bytes):
            floats.append(value)  # packed float32 (or one unpacked fixed32)
        elif number == 10 and isinstance(value, bytes):
            doubles.append(value)
        elif number == 5:
            int32s += _ints(wire, value)
        elif number == 7:
            int64s += _ints(wire, value)
        elif number == 14 and value == 1:
            raise OnnxWireError(f"initializer {name!r} keeps its data in an external file")
    dtype = TENSOR_DTYPES.get(data_type)
    if dtype is None:
        raise OnnxWireError(f"initializer {name!r} has element type {data_type}, not a numeric one")
    count = int(np.prod(dims)) if dims else 1
    if raw is not None:
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    elif data_type == 1:
        array = np.frombuffer(b"".join(floats), dtype="<f4")
    elif data_type == 11:
        array = np.frombuffer(b"".join(doubles), dtype="<f8")
    elif data_type == 7:
        array = np.asarray(int64s, dtype=np.int64)
    elif data_type in (2, 3, 4, 5, 6, 9):
        array = np.asarray(int32s, dtype=np.int64).astype(dtype)
    else:
        raise OnnxWireError(f"initializer {name!r}: element type {data_type} without raw_data is not supported")
    if array.size != count:
        raise OnnxWireError(f"initializer {name!r} holds {array.size} values for dims {dims}")
    return Initializer(name, data_type, tuple(dims), array.astype(dtype, copy=False).reshape(dims))


def _attribute(data: bytes) -> Attribute:
    name = ""
    value: float | int | bytes | tuple[float, ...] | tuple[int, ...] | None = None
    floats: list[float] = []
    ints: list[int] = []
    for number, wire, item in _fields(data):
        if number == 1:
            name = _text(item)
        elif number == 2 and isinstance(item, bytes):
            value = float(np.frombuffer(item, dtype="<f4")[0])
        elif number == 3:
            value = _ints(wire, item)[0]
        elif number == 4 and isinstance(item, bytes):
            value = item
        elif number == 7 and isinstance(item, bytes):
            floats += np.frombuffer(item, dtype="<f4").tolist()
        elif number == 8:
            ints += _ints(wire, item)
    if floats:
        value = tuple(floats)
    elif ints:
        value = tuple(ints)
    return Attribute(name, value, bytes(data))


def _node(data: bytes) -> Node:
    inputs: list[str] = []
    outputs: list[str] = []
    attributes: list[Attribute] = []
    op_type = domain = ""
    for number, _wire, value in _fields(data):
        if number == 1:
            inputs.append(_text(value))
        elif number == 2:
            outputs.append(_text(value))
        elif number == 4:
            op_type = _text(value)
        elif number == 7:
            domain = _text(value)
        elif number == 5 and isinstance(value, bytes):
            attributes.append(_attribute(value))
    return Node(op_type, tuple(inputs), tuple(outputs), tuple(attributes), domain)


def _value_info(data: bytes) -> ValueInfo:
    name, shape = "", []
    for number, _w, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2 and isinstance(value, bytes):  # TypeProto
            for n2, _w2, tensor in _fields(value):
                if n2 != 1 or not isinstance(tensor, bytes):  # tensor_type
                    continue
                for n3, _w3, shape_msg in _fields(tensor):
                    if n3 != 2 or not isinstance(shape_msg, bytes):  # shape
                        continue
                    for n4, _w4, dim in _fields(shape_msg):
                        if n4 != 1 or not isinstance(dim, bytes):
                            continue
                        entry: int | str = "?"
                        for n5, w5, v5 in _fields(dim):
                            if n5 == 1:
                                entry = _ints(w5, v5)[0]
                            elif n5 == 2:
                                entry = _text(v5)
                        shape.append(entry)
    return ValueInfo(name, shape)


def parse_model(data: bytes) -> OnnxModel:
    """The graph, initializers, inputs/outputs and metadata of a serialized ``ModelProto``."""
    model = OnnxModel()
    graph: bytes | None = None
    for number, _wire, value in _fields(data):
        if number == 7 and isinstance(value, bytes):
            graph = value
        elif number == 14 and isinstance(value, bytes):
            try:
                entry = {n: v.decode("utf-8") for n, _w, v in _fields(value) if isinstance(v, bytes)}
            except UnicodeDecodeError:
                raise MetadataNotTextError("its metadata is not UTF-8 text: the file is damaged") from None
            model.metadata[entry.get(1, "")] = entry.get(2, "")
    if graph is None:
        raise OnnxWireError("no graph in the model")
    for number, _wire, value in _fields(graph):
        if not isinstance(value, bytes):
            continue
        if number == 1:
            model.nodes.append(_node(value))
        elif number == 5:
            init = _tensor(value)
            model.initializers[init.name] = init
        elif number == 11:
            model.inputs.append(_value_info(value))
        elif number == 12:
            model.outputs.append(_value_info(value))
    # Initializers may also be listed as graph inputs (older exporters): they are not fed.
    model.inputs = [v for v in model.inputs if v.name not in model.initializers]
    return model


def read_model(path: Path) -> OnnxModel:
    """:func:`parse_model` of a file; raises :class:`EmbodiedError` naming the file."""
    try:
        return parse_model(Path(path).read_bytes())
    except MetadataNotTextError as err:
        raise EmbodiedError(f"{path}: {err}; re-export the run") from None
    except OnnxWireError as err:
        raise EmbodiedError(f"{path}: not a valid ONNX model ({err}); re-export the run") from None
    except (OSError, ValueError, IndexError) as err:
        raise EmbodiedError(f"{path}: not a valid ONNX model ({err}); re-export the run") from None


def graph_sha256_of(model: OnnxModel) -> str:
    """``model_sha256`` of a parsed model: the definition of
    :func:`embodied.policy_io.graph_sha256`, computed from the wire form."""
    digest = hashlib.sha256()
    for name in sorted(model.initializers):
        init = model.initializers[name]
        digest.update(f"I{init.name}|{init.data_type}|{init.dims}|".encode())
        array = init.array
        digest.update(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    for node in model.nodes:
        digest.update(f"N{node.op_type}|{list(node.inputs)}|{list(node.outputs)}|".encode())
        for attr in sorted(node.attributes, key=lambda a: a.name):
            digest.update(attr.serialized)
    return digest.hexdigest()
