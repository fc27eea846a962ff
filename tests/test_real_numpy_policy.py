"""MLP-class policies run from policy.onnx in numpy alone (embodied.real.numpy_policy), equal to
onnxruntime within 1e-6, and model_sha256 is checked from the file's bytes without onnx: the robot
runtime then needs neither onnxruntime nor onnx, whose wheels would replace a ROS 2 Python's numpy."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from export_support import write_io
from real_support import export_policy, quad_spec
from test_real_runtime_imports import BLOCK_TORCH
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.layers import mlp_arrays, with_io_symmetry
from embodied.export.onnx import export_onnx, probe_observations
from embodied.onnx_wire import read_model
from embodied.policies.mlp import ExportedPolicy, mlp
from embodied.policy_io import graph_sha256, onnx_file_sha256, read_policy_io
from embodied.real.numpy_policy import NumpySession, unsupported_ops
from embodied.real.runner import PolicyRunner

PARITY = 1e-6


def _export(tmp_path: Path, act: str, clip: float, symmetry: bool) -> tuple[Path, nn.Module]:
    spec = quad_spec(history=2)
    torch.manual_seed(7)
    net = mlp(spec.obs_dim, [32, 32], spec.action_dim, act=act)
    mean = torch.randn(spec.obs_dim) * 0.3
    std = torch.rand(spec.obs_dim) + 0.5
    module: nn.Module = ExportedPolicy(net, mean, std, clip)
    if symmetry:
        module = with_io_symmetry(module, spec)
    else:
        spec = dataclasses.replace(spec, extra={k: v for k, v in spec.extra.items() if k != "yaw_symmetry"})
    export_onnx(module, spec, tmp_path)
    write_io(module, spec, tmp_path)
    return tmp_path, module


@pytest.mark.parametrize(
    ("act", "clip", "symmetry"),
    [("tanh", 5.0, True), ("elu", math.inf, False), ("relu", 10.0, False), ("tanh", math.inf, False)],
)
def test_numpy_equals_onnxruntime(tmp_path: Path, act: str, clip: float, symmetry: bool) -> None:
    export, module = _export(tmp_path, act, clip, symmetry)
    path = export / "policy.onnx"
    model = read_model(path)
    assert unsupported_ops(model) == []
    probes = probe_observations(mlp_arrays(module), num=512, seed=1)  # wide: tanh saturates, the clip engages
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["action"], {"obs": probes})
    (got,) = NumpySession(model, path).run(["action"], {"obs": probes})
    assert got.dtype == np.float32 and got.shape == want.shape
    assert float(np.max(np.abs(got - want))) <= PARITY
    # the runner picks numpy by itself, and agrees with its onnxruntime engine step by step
    auto, onnxrt = PolicyRunner(export), PolicyRunner(export, engine="onnxruntime")
    assert auto.engine == "numpy" and onnxrt.engine == "onnxruntime"
    for obs in probes[:20]:
        assert float(np.max(np.abs(auto(obs) - onnxrt(obs)))) <= PARITY


def test_model_hash_from_the_file_bytes_equals_onnx_definition(tmp_path: Path) -> None:
    export = export_policy(tmp_path, quad_spec(history=2), seed=3)
    path = export / "policy.onnx"
    want = read_policy_io(export).model_sha256
    assert onnx_file_sha256(path) == graph_sha256(onnx.load(str(path)).graph) == want


def test_tampered_weights_are_refused_without_onnx(tmp_path: Path) -> None:
    export = export_policy(tmp_path, quad_spec(history=2), seed=3)
    path = export / "policy.onnx"
    weight = read_model(path).initializers["layer0.weight"].array
    data = path.read_bytes()
    at = data.index(weight.astype("<f4").tobytes()[:16])
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    with pytest.raises(EmbodiedError, match="altered or damaged"):
        PolicyRunner(export)


def test_runtime_runs_without_onnx_onnxruntime_or_torch(tmp_path: Path) -> None:
    export = export_policy(tmp_path / "export", quad_spec(history=2), seed=3)
    obs = np.linspace(-1, 1, quad_spec(history=2).obs_dim).astype(np.float32)
    want = PolicyRunner(export, engine="onnxruntime")(obs).tolist()
    block = BLOCK_TORCH.replace(
        'name == "torch" or name.startswith("torch.")', 'name.split(".")[0] in ("torch", "onnx", "onnxruntime")'
    )
    code = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        from embodied.real.runner import PolicyRunner
        runner = PolicyRunner({str(export)!r})
        action = runner(np.asarray({obs.tolist()!r}, dtype=np.float32))
        assert not any(m.split(".")[0] in ("torch", "onnx", "onnxruntime") for m in sys.modules)
        print(json.dumps([runner.engine, action.tolist()]))
        """
    )
    result = subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    engine, action = json.loads(result.stdout)
    assert engine == "numpy" and np.max(np.abs(np.asarray(action) - np.asarray(want))) <= PARITY
