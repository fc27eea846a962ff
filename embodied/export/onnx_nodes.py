"""ONNX node helpers shared by the graph builders (:mod:`embodied.export.onnx` for MLPs,
:mod:`embodied.export.flow_onnx` for flow samplers)."""

from __future__ import annotations

from typing import Any

from embodied.errors import EmbodiedError
from embodied.export.layers import DenseLayer


def activation_nodes(layer: DenseLayer, x: str, prefix: str) -> tuple[list[Any], str]:
    """Nodes applying ``layer.activation`` to tensor ``x``; returns ``(nodes, output name)``.

    ``mish`` is ``x * tanh(softplus(x))`` (opset 17 has no Mish operator)."""
    from onnx import helper

    out = f"{prefix}.act"
    if layer.activation == "none":
        return [], x
    if layer.activation == "tanh":
        return [helper.make_node("Tanh", [x], [out])], out
    if layer.activation == "relu":
        return [helper.make_node("Relu", [x], [out])], out
    if layer.activation == "elu":
        return [helper.make_node("Elu", [x], [out], alpha=layer.elu_alpha)], out
    if layer.activation == "mish":
        return [
            helper.make_node("Softplus", [x], [f"{prefix}.softplus"]),
            helper.make_node("Tanh", [f"{prefix}.softplus"], [f"{prefix}.tanh_softplus"]),
            helper.make_node("Mul", [x, f"{prefix}.tanh_softplus"], [out]),
        ], out
    raise EmbodiedError(f"{prefix}: activation {layer.activation!r} has no ONNX form here")
