"""ONNX export (parity with torch through onnxruntime), policy_io.json and exporter error cases."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from export_support import generic_io_spec, linear_layer, quad_io_spec, random_policy, write_io
from torch import nn

from embodied.errors import EmbodiedError, NonFiniteError
from embodied.export.layers import mlp_arrays
from embodied.export.onnx import check_parity, export_onnx, load_onnx_policy
from embodied.export.policy_io import check_hash, read_policy_io, weights_sha256
from embodied.policies.mlp import ExportedPolicy


def test_onnx_matches_torch_on_random_and_recorded_obs(tmp_path: Path) -> None:
    module = random_policy()
    spec = quad_io_spec()
    recorded = np.random.default_rng(3).normal(size=(50, 146)).astype(np.float32)
    report = export_onnx(module, spec, tmp_path, recorded_obs=recorded)
    assert report.num_checked == 256 + 50
    assert report.max_abs_err <= 1e-5
    model = onnx.load(str(report.path))
    assert [i.name for i in model.graph.input] == ["obs"]
    assert [o.name for o in model.graph.output] == ["action"]
    assert model.opset_import[0].version >= 17
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["obs_fields"]) == ["pos_err_h", "rot_hb", "lin_vel_h", "ang_vel_b", "prev_actions"]
    assert float(props["control_period_s"]) == pytest.approx(0.01)
    assert props["model_sha256"] == weights_sha256(module)
    # Dynamic batch: any batch size runs and matches torch row by row.
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    for batch in (1, 7):
        obs = recorded[:batch]
        (got,) = session.run(["action"], {"obs": obs})
        want = module(torch.from_numpy(obs)).numpy()
        assert got.shape == (batch, 4)
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("act", ["elu", "relu"])
def test_onnx_other_activations_and_no_clip(tmp_path: Path, act: str) -> None:
    module = random_policy(obs_dim=7, hidden=(5, 9), action_dim=3, act=act, clip=float("inf"))
    report = export_onnx(module, generic_io_spec(7, 3), tmp_path)
    assert report.max_abs_err <= 1e-5


def test_parity_check_catches_a_wrong_model(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    report = export_onnx(module, generic_io_spec(6, 2), tmp_path)
    other = random_policy(obs_dim=6, hidden=(8,), action_dim=2, seed=1)
    obs = np.random.default_rng(0).normal(size=(20, 6)).astype(np.float32)
    with pytest.raises(EmbodiedError, match="differs from torch"):
        check_parity(other, report.path, obs)


def test_unsupported_layer_is_named() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 2))
    module = ExportedPolicy(net, torch.zeros(4), torch.ones(4), 5.0)
    with pytest.raises(EmbodiedError, match=r"net\[1\] \(LayerNorm\)"):
        mlp_arrays(module)


def test_non_finite_weights_are_rejected(tmp_path: Path) -> None:
    module = random_policy(obs_dim=4, hidden=(8,), action_dim=2)
    with torch.no_grad():
        linear_layer(module.net, 2).weight[0, 3] = float("nan")
    with pytest.raises(NonFiniteError, match=r"net\[2\] \(Linear\) weight"):
        export_onnx(module, generic_io_spec(4, 2), tmp_path)


def test_dimension_mismatch_with_io_spec(tmp_path: Path) -> None:
    module = random_policy(obs_dim=5, hidden=(8,), action_dim=2)
    with pytest.raises(EmbodiedError, match=r"5 -> 2.*6 -> 2"):
        export_onnx(module, generic_io_spec(6, 2), tmp_path)


def test_policy_io_roundtrip_and_validation(tmp_path: Path) -> None:
    module = random_policy(obs_dim=146)
    spec = quad_io_spec()
    path = write_io(module, spec, tmp_path)
    loaded = read_policy_io(tmp_path)
    assert loaded.io_spec == spec
    assert loaded.action_history == 32
    assert loaded.model_sha256 == weights_sha256(module)
    check_hash(loaded, module)
    with pytest.raises(EmbodiedError, match="does not match"):
        check_hash(loaded, random_policy(seed=5))
    data = json.loads(path.read_text())
    data["obs_dim"] = 145
    path.write_text(json.dumps(data))
    with pytest.raises(EmbodiedError, match="obs_dim is 145 but the obs_fields sum to 146"):
        read_policy_io(path)
    del data["model_sha256"]
    path.write_text(json.dumps(data))
    with pytest.raises(EmbodiedError, match=r"missing key.*model_sha256"):
        read_policy_io(path)
    with pytest.raises(EmbodiedError, match="not found"):
        read_policy_io(tmp_path / "nowhere")


def test_weights_hash_is_content_based() -> None:
    a = random_policy(obs_dim=6, hidden=(8,), action_dim=2, seed=0)
    b = random_policy(obs_dim=6, hidden=(8,), action_dim=2, seed=0)
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        linear_layer(b.net, 0).bias[0] += 1e-6
    assert weights_sha256(a) != weights_sha256(b)


def test_load_onnx_policy_runs_the_export(tmp_path: Path) -> None:
    module = random_policy(obs_dim=146)
    spec = quad_io_spec()
    export = tmp_path / "export"
    write_io(module, spec, export)
    export_onnx(module, spec, export)
    env = SimpleNamespace(obs_spec={"policy": (146,)}, action_dim=4, device=torch.device("cpu"))
    act = load_onnx_policy(tmp_path, env)
    obs = torch.randn(9, 146)
    np.testing.assert_allclose(act({"policy": obs}).numpy(), module(obs).numpy(), atol=1e-5)
    wrong_env = SimpleNamespace(obs_spec={"policy": (18,)}, action_dim=4, device=torch.device("cpu"))
    with pytest.raises(EmbodiedError, match="146 -> 4"):
        load_onnx_policy(tmp_path, wrong_env)
    with pytest.raises(EmbodiedError, match="--format onnx"):
        load_onnx_policy(tmp_path / "missing", env)
