"""The ONNX graph of a flow sampler (:class:`~embodied.export.flow_arrays.FlowArrays`), built
node by node like the MLP graph, so its hash (:func:`embodied.policy_io.graph_sha256`) is a
function of the weights alone and a deployment recomputes it from ``policy.onnx``.

Input ``obs [batch, D]``, output ``action [batch, H, A]`` (the whole chunk). The velocity
network's first layer is split by input: ``W [h, D + F + E] = [W_obs | W_x | W_t]``. The
observation part is computed once per plan; the time part of step ``k`` is a constant
``time_feats[k] @ W_tᵀ + b`` folded into that step's bias, so the ``K`` unrolled steps need no
concatenation and the graph holds each weight once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from embodied.export.flow_arrays import FlowArrays
from embodied.export.onnx_nodes import activation_nodes
from embodied.policy_io import FORMAT_VERSIONS


def build_flow_graph(arrays: FlowArrays) -> Any:
    """The checked ONNX ``ModelProto`` (no metadata yet) computing the sampler in ``arrays``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: np.ndarray, dtype: type = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    d, f = arrays.obs_dim, arrays.flat_dim
    x = node("Sub", ["obs", const("obs_mean", arrays.obs_mean)], "obs_centered")
    obs_n = node("Div", [x, const("obs_std", arrays.obs_std)], "obs_norm")
    if math.isfinite(arrays.obs_clip):
        lo = const("obs_clip_low", np.array(-arrays.obs_clip))
        hi = const("obs_clip_high", np.array(arrays.obs_clip))
        obs_n = node("Clip", [obs_n, lo, hi], "obs_clipped")
    first, rest = arrays.layers[0], arrays.layers[1:]
    w = np.asarray(first.weight, dtype=np.float32)
    zero_bias = const("zero_bias", np.zeros(first.out_dim))
    obs_proj = node("Gemm", [obs_n, const("layer0.weight_obs", w[:, :d]), zero_bias], "layer0.obs_proj", transB=1)
    w_x = const("layer0.weight_x", w[:, d : d + f])
    for i, layer in enumerate(rest, start=1):
        const(f"layer{i}.weight", layer.weight)
        const(f"layer{i}.bias", layer.bias)
    steps = const("denoise_steps", np.array(float(arrays.steps)))
    x = const("x0", arrays.x0[None, :])  # [1, F]: broadcasts against the batch at the first step
    # float64 for the folded time bias, then rounded once (torch sums the same terms in float32)
    time_bias = np.asarray(arrays.time_feats, np.float64) @ w[:, d + f :].T.astype(np.float64) + first.bias
    for k in range(arrays.steps):
        p = f"step{k}"
        h = node("Gemm", [x, w_x, const(f"{p}.time_bias", time_bias[k])], f"{p}.x_proj", transB=1)
        h = node("Add", [obs_proj, h], f"{p}.layer0.linear")
        act, h = activation_nodes(first, h, f"{p}.layer0")
        nodes.extend(act)
        for i, layer in enumerate(rest, start=1):
            h = node("Gemm", [h, f"layer{i}.weight", f"layer{i}.bias"], f"{p}.layer{i}.linear", transB=1)
            act, h = activation_nodes(layer, h, f"{p}.layer{i}")
            nodes.extend(act)
        velocity_step = node("Div", [h, steps], f"{p}.velocity_step")
        x = node("Add", [x, velocity_step], f"{p}.x")
    clipped = node("Clip", [x, const("action_low", np.array(-1.0)), const("action_high", np.array(1.0))], "chunk_flat")
    shape = const("chunk_shape", np.array([-1, arrays.chunk, arrays.action_dim]), np.int64)
    node("Reshape", [clipped, shape], "action")
    graph = helper.make_graph(
        nodes,
        "embodied_flow_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", arrays.chunk, arrays.action_dim])],
        initializer=inits,
    )
    opset = FORMAT_VERSIONS["onnx_opset"]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="embodied")
    model.ir_version = min(model.ir_version, 9)  # readable by onnxruntime releases from 2023 on
    onnx.checker.check_model(model)
    return model
