"""ONNX export of an ExportedPolicy, checked against onnxruntime, and an ONNX policy loader.

The graph is built node by node from the validated arrays (:mod:`embodied.export.layers`)
rather than traced, so it has exactly one input ``obs`` [batch, obs_dim] and one output
``action`` [batch, action_dim] (batch dynamic), no training leftovers, and it does not depend
on torch's exporter backends.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.action_chunks import ChunkExecutor
from embodied.env import ObsDict
from embodied.errors import EmbodiedError
from embodied.export.flow_arrays import FlowArrays, flow_arrays, is_flow_sampler
from embodied.export.flow_onnx import build_flow_graph
from embodied.export.layers import MlpArrays, mlp_arrays, with_io_symmetry
from embodied.export.onnx_nodes import activation_nodes
from embodied.export.policy_io import FORMAT_VERSIONS, ONNX_FILENAME, read_policy_io
from embodied.io_spec import IOSpec
from embodied.policy_io import check_session_hash, graph_sha256
from embodied.residual_graph import ResidualGraph

log = logging.getLogger(__name__)

OPSET = FORMAT_VERSIONS["onnx_opset"]
PARITY_TOL = 1e-5
"""Largest allowed ``|onnxruntime - torch|`` over every checked action entry."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote and how closely onnxruntime matches torch."""

    path: Path
    model_sha256: str
    max_abs_err: float
    num_checked: int


def build_graph(arrays: MlpArrays) -> Any:
    """The checked ONNX ``ModelProto`` (no metadata yet) computing the policy in ``arrays``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=np.float32), name))
        return name

    x = "obs"
    sym = arrays.symmetry
    if sym is not None:
        # flip = obs[:, select] < 0; obs' = where(flip, obs[:, source] * sign, obs)
        inits.append(numpy_helper.from_array(np.array([sym.select_index], dtype=np.int64), "sym_select_index"))
        inits.append(numpy_helper.from_array(sym.obs_source.astype(np.int64), "sym_obs_source"))
        inits.append(numpy_helper.from_array(sym.action_source.astype(np.int64), "sym_action_source"))
        nodes.append(helper.make_node("Gather", [x, "sym_select_index"], ["sym_select"], axis=1))
        nodes.append(helper.make_node("Less", ["sym_select", const("sym_zero", np.array(0.0))], ["sym_flip"]))
        nodes.append(helper.make_node("Gather", [x, "sym_obs_source"], ["sym_obs_gathered"], axis=1))
        nodes.append(
            helper.make_node("Mul", ["sym_obs_gathered", const("sym_obs_sign", sym.obs_sign)], ["sym_obs_flipped"])
        )
        nodes.append(helper.make_node("Where", ["sym_flip", "sym_obs_flipped", x], ["obs_canonical"]))
        x = "obs_canonical"
    nodes.append(helper.make_node("Sub", [x, const("obs_mean", arrays.obs_mean)], ["obs_centered"]))
    nodes.append(helper.make_node("Div", ["obs_centered", const("obs_std", arrays.obs_std)], ["obs_norm"]))
    x = "obs_norm"
    if math.isfinite(arrays.obs_clip):
        lo = const("obs_clip_low", np.array(-arrays.obs_clip))
        hi = const("obs_clip_high", np.array(arrays.obs_clip))
        nodes.append(helper.make_node("Clip", [x, lo, hi], ["obs_clipped"]))
        x = "obs_clipped"
    for i, layer in enumerate(arrays.layers):
        w = const(f"layer{i}.weight", layer.weight)
        b = const(f"layer{i}.bias", layer.bias)
        # Gemm with transB=1 consumes the [out, in] row-major weight as stored by torch.
        nodes.append(helper.make_node("Gemm", [x, w, b], [f"layer{i}.linear"], transB=1))
        x = f"layer{i}.linear"
        act, x = activation_nodes(layer, x, f"layer{i}")
        nodes += act
    lo = const("action_low", np.array(-1.0))
    hi = const("action_high", np.array(1.0))
    if sym is None:
        nodes.append(helper.make_node("Clip", [x, lo, hi], ["action"]))
    else:  # motors relabelled back where the observation was flipped
        nodes.append(helper.make_node("Clip", [x, lo, hi], ["action_canonical"]))
        nodes.append(helper.make_node("Gather", ["action_canonical", "sym_action_source"], ["action_flipped"], axis=1))
        nodes.append(helper.make_node("Where", ["sym_flip", "action_flipped", "action_canonical"], ["action"]))
    graph = helper.make_graph(
        nodes,
        "embodied_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", arrays.obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", arrays.action_dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="embodied")
    model.ir_version = min(model.ir_version, 9)  # readable by onnxruntime releases from 2023 on
    onnx.checker.check_model(model)
    return model


def onnx_model(module: nn.Module) -> tuple[MlpArrays | FlowArrays, Any]:
    """``(arrays, checked ModelProto without metadata)`` of an exported module of any artifact
    kind: an MLP (output ``action [batch, A]``) or a flow sampler (``action [batch, H, A]``)."""
    if is_flow_sampler(module):
        flow = flow_arrays(module)
        return flow, build_flow_graph(flow)
    arrays = mlp_arrays(module)
    return arrays, build_graph(arrays)


def _metadata(io_spec: IOSpec, model_sha256: str) -> dict[str, str]:
    return {
        "obs_fields": json.dumps([f.name for f in io_spec.obs_fields]),
        "obs_sizes": json.dumps([f.size for f in io_spec.obs_fields]),
        "obs_scales": json.dumps([f.scale for f in io_spec.obs_fields]),
        "action_fields": json.dumps([f.name for f in io_spec.action_fields]),
        "action_scales": json.dumps([f.scale for f in io_spec.action_fields]),
        "action_offsets": json.dumps([f.offset for f in io_spec.action_fields]),
        "control_period_s": repr(io_spec.control_period_s),
        "model_sha256": model_sha256,
        "policy_io_version": str(FORMAT_VERSIONS["policy_io"]),
    }


def probe_observations(arrays: MlpArrays | FlowArrays, num: int = 256, seed: int = 0) -> np.ndarray:
    """``[num, obs_dim]`` float32 observations spread over ±4 std around the mean.

    Wide enough that tanh saturates and the observation clip engages, so parity checks
    cover every branch of the exported graph. With a symmetry flip every odd row is the mirror
    image of the row before it (:func:`symmetry_twin`), so half the probes take each branch.
    """
    rng = np.random.default_rng(seed)
    z = rng.uniform(-4.0, 4.0, size=(num, arrays.obs_dim)).astype(np.float32)
    probes = (arrays.obs_mean + z * arrays.obs_std).astype(np.float32)
    if arrays.symmetry is not None:
        probes[1::2] = symmetry_twin(arrays, probes[0::2][: len(probes[1::2])])
    return probes


def symmetry_twin(arrays: MlpArrays, obs: np.ndarray) -> np.ndarray:
    """``obs [N, obs_dim]`` mapped through the symmetry (``obs[:, source] * sign``), whichever side
    it is on: the same physical situation seen from the other half, taking the other branch
    (unless ``obs[select_index]`` is 0)."""
    sym = arrays.symmetry
    if sym is None:
        raise EmbodiedError("the policy has no symmetry flip")
    return (np.asarray(obs, dtype=np.float32)[:, sym.obs_source] * sym.obs_sign).astype(np.float32)


def check_parity(module: nn.Module, path: Path, observations: np.ndarray, tol: float = PARITY_TOL) -> float:
    """Max ``|onnxruntime - torch|`` over ``observations`` [N, D]; raises above ``tol``."""
    return check_parity_inputs(module, path, {"obs": np.asarray(observations, dtype=np.float32)}, tol)


def check_parity_inputs(
    module: nn.Module, path: Path, inputs: Mapping[str, np.ndarray], tol: float = PARITY_TOL
) -> float:
    """Max ``|onnxruntime - torch|`` of output ``action`` for graph inputs ``inputs`` (name ->
    ``[N, ...]`` array, in ``module.forward``'s argument order); raises above ``tol``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
    (got,) = session.run(["action"], feeds)
    with torch.no_grad():
        want = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not err <= tol:
        raise EmbodiedError(f"{path}: onnxruntime differs from torch by {err:.3g} (> {tol:g}); export is wrong")
    return err


def export_onnx(
    module: nn.Module,
    io_spec: IOSpec,
    export_dir: Path,
    recorded_obs: np.ndarray | None = None,
) -> OnnxExport:
    """Write ``export_dir/policy.onnx`` and verify it against onnxruntime.

    ``recorded_obs`` [N, obs_dim] (e.g. from an evaluation rollout) is checked in addition to
    random probes. Raises :class:`EmbodiedError` when dimensions disagree with ``io_spec`` or
    parity exceeds :data:`PARITY_TOL`.
    """
    import onnx
    from onnx import helper

    module = with_io_symmetry(module, io_spec)
    arrays, model = onnx_model(module)
    if arrays.obs_dim != io_spec.obs_dim or arrays.action_dim != io_spec.action_dim:
        raise EmbodiedError(
            f"policy maps {arrays.obs_dim} -> {arrays.action_dim} but its policy_io describes "
            f"{io_spec.obs_dim} -> {io_spec.action_dim}"
        )
    sha = graph_sha256(model.graph)  # = weights_sha256(module), without building the graph twice
    helper.set_model_props(model, _metadata(io_spec, sha))
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    path = export_dir / ONNX_FILENAME
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    probes = [probe_observations(arrays)]
    if recorded_obs is not None:
        probes.append(np.asarray(recorded_obs, dtype=np.float32).reshape(-1, arrays.obs_dim))
        if arrays.symmetry is not None:  # a task's observations are canonical: check the mirror images too
            probes.append(symmetry_twin(arrays, probes[-1]))
    observations = np.concatenate(probes)
    err = check_parity(module, path, observations)
    log.info("wrote %s (max |onnx - torch| = %.2e over %d observations)", path, err, len(observations))
    return OnnxExport(path, sha, err, len(observations))


def load_onnx_policy(run_dir: Path, env: Any) -> Callable[[ObsDict], torch.Tensor]:
    """A callable ``obs -> action [N, A]`` running ``RUN_DIR/export/policy.onnx`` on onnxruntime
    (a chunked policy's plans executed receding-horizon, ``policy_io.json`` ``extra.action_chunk``).

    Checks the file's dimensions and hash against ``policy_io.json`` and the env's spec.
    """
    import onnxruntime as ort

    export_dir = Path(run_dir) / "export"
    path = export_dir / ONNX_FILENAME
    if not path.is_file():
        raise EmbodiedError(f"{path} not found; run `embodied export {run_dir} --format onnx` first")
    policy_io = read_policy_io(export_dir)
    obs_dim = int(env.obs_spec["policy"][0])
    if obs_dim != policy_io.io_spec.obs_dim or int(env.action_dim) != policy_io.io_spec.action_dim:
        raise EmbodiedError(
            f"{path} maps {policy_io.io_spec.obs_dim} -> {policy_io.io_spec.action_dim} but the env has "
            f"{obs_dim} -> {env.action_dim}"
        )
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's InvalidProtobuf/Fail share no importable base class
        raise EmbodiedError(
            f"{path}: onnxruntime cannot load it ({' '.join(str(err).split())[:160]}); re-export"
        ) from None
    check_session_hash(session, policy_io, path)
    device = env.device

    def plan(x: np.ndarray) -> np.ndarray:
        (out,) = session.run(["action"], {"obs": np.ascontiguousarray(x)})
        return np.asarray(out)

    # a chunked policy returns [N, H, A]: its actions run receding-horizon, as in deployment
    executor = ChunkExecutor(plan, policy_io.chunk)
    residual = (
        None
        if policy_io.residual_step is None
        else ResidualGraph(
            export_dir, policy_io, lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        )
    )

    def act(obs: ObsDict) -> torch.Tensor:
        x = np.ascontiguousarray(obs["policy"].detach().to("cpu", torch.float32).numpy())
        action = np.ascontiguousarray(executor(x), dtype=np.float32)
        if residual is not None:  # policy.onnx planned the base's chunks; the residual corrects each step
            action = np.ascontiguousarray(residual(x, action))
        return torch.from_numpy(action).to(device)

    return act
