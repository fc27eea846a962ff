"""Run an exported MLP-class ``policy.onnx`` in numpy alone (no onnxruntime, no onnx).

Every policy the C exporter handles (observation normalization and clip, ``Linear`` layers with
tanh / ELU / ReLU, the action clip, the optional symmetry flip: :mod:`embodied.export.onnx`
builds it from exactly these operators) is a graph of the :data:`OPS` below; so are mish layers.
:class:`NumpySession` evaluates such a graph, read from the ONNX file's own bytes
(:mod:`embodied.onnx_wire`), in float32 like onnxruntime (tests hold the two within 1e-6), and
offers the slice of onnxruntime's ``InferenceSession`` interface the runner uses. Graphs with
any other operator (image encoders, flow samplers) still need onnxruntime:
:func:`unsupported_ops` names what is missing.

Why numpy: a ROS 2 Humble Python has numpy 1.21.5 and no onnxruntime wheel installs beside it
without replacing numpy (onnxruntime >= 1.16 needs >= 1.21.6); a numpy 2 shadowing ROS's breaks
numpy-1 extensions such as cv_bridge. Everything here works with numpy from 1.21 on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import EmbodiedError
from embodied.onnx_wire import Node, OnnxModel, ValueInfo, read_model

Op = Callable[[Node, list[np.ndarray]], np.ndarray]


def _gemm(node: Node, x: list[np.ndarray]) -> np.ndarray:
    a, b = x[0], x[1]
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    out = np.matmul(a, b)
    alpha, beta = float(node.attr("alpha", 1.0) or 0.0), float(node.attr("beta", 1.0) or 0.0)
    if alpha != 1.0:
        out = out * np.float32(alpha)
    if len(x) > 2 and beta != 0.0:
        out = out + (x[2] if beta == 1.0 else x[2] * np.float32(beta))
    return out


def _clip(_node: Node, x: list[np.ndarray]) -> np.ndarray:
    out = x[0]
    if len(x) > 1 and x[1].size:
        out = np.maximum(out, x[1])
    if len(x) > 2 and x[2].size:
        out = np.minimum(out, x[2])
    return out


def _elu(node: Node, x: list[np.ndarray]) -> np.ndarray:
    alpha = np.float32(node.attr("alpha", 1.0))
    v = x[0]
    # expm1 on the negative side only: exp of a large positive input would overflow (and warn)
    return np.where(v > 0, v, alpha * np.expm1(np.minimum(v, 0))).astype(v.dtype)


def _gather(node: Node, x: list[np.ndarray]) -> np.ndarray:
    return np.take(x[0], x[1].astype(np.int64), axis=int(node.attr("axis", 0) or 0))


OPS: dict[str, Op] = {
    "Gemm": _gemm,
    "MatMul": lambda _n, x: np.matmul(x[0], x[1]),
    "Add": lambda _n, x: x[0] + x[1],
    "Sub": lambda _n, x: x[0] - x[1],
    "Mul": lambda _n, x: x[0] * x[1],
    "Div": lambda _n, x: x[0] / x[1],
    "Clip": _clip,
    "Tanh": lambda _n, x: np.tanh(x[0]),
    "Relu": lambda _n, x: np.maximum(x[0], np.zeros((), x[0].dtype)),
    "Elu": _elu,
    "Softplus": lambda _n, x: np.logaddexp(np.zeros((), x[0].dtype), x[0]),
    "Less": lambda _n, x: x[0] < x[1],
    "Where": lambda _n, x: np.where(x[0], x[1], x[2]),
    "Gather": _gather,
}
"""ONNX operator -> numpy implementation (default domain, the attributes the exporters write)."""


def unsupported_ops(model: OnnxModel) -> list[str]:
    """Operators of ``model`` that :class:`NumpySession` cannot run (empty: it runs it all)."""
    return sorted({n.op_type for n in model.nodes if n.op_type not in OPS or n.domain not in ("", "ai.onnx")})


class _Meta:
    def __init__(self, metadata: Mapping[str, str]) -> None:
        self.custom_metadata_map = dict(metadata)


class NumpySession:
    """``session.run([output], {input: array})`` of an ONNX graph of :data:`OPS`, in numpy.

    Mirrors the parts of ``onnxruntime.InferenceSession`` the runner uses (``get_inputs``,
    ``get_outputs``, ``get_modelmeta().custom_metadata_map``, ``run``)."""

    def __init__(self, model: OnnxModel, path: Path) -> None:
        missing = unsupported_ops(model)
        if missing:
            raise EmbodiedError(f"{path}: operators {', '.join(missing)} need onnxruntime (pip install onnxruntime)")
        self.path = path
        self._model = model
        self._constants = {name: init.array for name, init in model.initializers.items()}

    @classmethod
    def load(cls, path: Path) -> NumpySession:
        return cls(read_model(path), Path(path))

    def get_inputs(self) -> list[ValueInfo]:
        return list(self._model.inputs)

    def get_outputs(self) -> list[ValueInfo]:
        return list(self._model.outputs)

    def get_modelmeta(self) -> _Meta:
        return _Meta(self._model.metadata)

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Evaluate the graph in node order (exporters write it topologically sorted)."""
        values: dict[str, Any] = dict(self._constants)
        values.update(feeds)
        for node in self._model.nodes:
            try:
                args = [values[name] for name in node.inputs if name]
            except KeyError as err:
                raise EmbodiedError(
                    f"{self.path}: node {node.op_type} reads {err.args[0]!r} before it is computed"
                ) from None
            values[node.outputs[0]] = OPS[node.op_type](node, args)
        names = list(output_names) if output_names else [o.name for o in self._model.outputs]
        return [np.asarray(values[name]) for name in names]
