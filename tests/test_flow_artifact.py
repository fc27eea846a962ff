"""Flow policies as artifacts: the chunk executor, the ``flow`` artifact kind, its ONNX graph
(the whole deterministic sampler, returning the chunk) and the deploy runner's receding horizon."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import generic_io_spec

from embodied.action_chunks import CHUNK_EXTRA_KEY, ChunkExecutor, ChunkSpec
from embodied.errors import EmbodiedError
from embodied.export.artifact import PolicyArtifact
from embodied.export.bundle import export_artifact
from embodied.export.policy_io import POLICY_IO_FILENAME
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg

OBS, ACT = 7, 2


def _flow(seed: int = 0, **cfg: object) -> FlowPolicy:
    torch.manual_seed(seed)
    policy = FlowPolicy(OBS, ACT, FlowPolicyCfg(hidden=(32, 32), **cfg))  # type: ignore[arg-type]
    policy.set_obs_stats(torch.randn(OBS), torch.rand(OBS) + 0.5)
    return policy


class _Planner:
    """Plans whose entries say when they were made and which step they are for."""

    def __init__(self, length: int) -> None:
        self.calls = 0
        self.length = length

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.calls += 1
        steps = np.arange(self.length, dtype=np.float64)
        plan = 100.0 * self.calls + steps  # [H]
        return np.broadcast_to(plan[None, :, None], (len(obs), self.length, 1)).copy()


def test_executor_runs_exec_steps_of_each_plan_then_replans() -> None:
    planner = _Planner(4)
    run = ChunkExecutor(planner, ChunkSpec(4, 2))
    obs = np.zeros((3, OBS))
    got = [float(run(obs)[0, 0]) for _ in range(5)]
    assert got == [100.0, 101.0, 200.0, 201.0, 300.0] and planner.calls == 3
    run.reset()
    assert float(run(obs)[0, 0]) == 400.0
    assert float(run(np.zeros((2, OBS)))[0, 0]) == 500.0  # another batch size: a fresh plan
    single = ChunkExecutor(lambda o: np.ones((len(o), ACT)), ChunkSpec())
    assert single(obs).shape == (3, ACT)  # an unchunked policy: one action per plan


def test_executor_temporal_ensemble_averages_what_each_plan_said_for_now() -> None:
    planner = _Planner(3)
    run = ChunkExecutor(planner, ChunkSpec(3, 1, temporal_ensemble=True))
    obs = np.zeros((1, OBS))
    got = [float(run(obs)[0, 0]) for _ in range(4)]
    # step t: the plan made at t (entry 0), at t-1 (entry 1), at t-2 (entry 2)
    assert got == [100.0, (200 + 101) / 2, (300 + 201 + 102) / 3, (400 + 301 + 202) / 3]
    with pytest.raises(EmbodiedError, match="exec_steps must be 1"):
        ChunkSpec(3, 2, temporal_ensemble=True)


@pytest.mark.parametrize(
    "raw", [{"length": 4}, {"length": 4, "exec_steps": 5}, {"length": "4", "exec_steps": 1}, [4, 1]]
)
def test_chunk_spec_from_policy_io_names_a_malformed_entry(raw: object) -> None:
    with pytest.raises(EmbodiedError, match=CHUNK_EXTRA_KEY):
        ChunkSpec.from_extra({CHUNK_EXTRA_KEY: raw}, "policy_io.json extra")
    assert ChunkSpec.from_extra({}) == ChunkSpec(1, 1)


@pytest.mark.parametrize("ensemble", [False, True])
def test_flow_artifact_round_trip_and_onnx_parity(tmp_path: Path, ensemble: bool) -> None:
    pytest.importorskip("onnxruntime")
    policy = _flow(chunk=4, exec_steps=1 if ensemble else 2, temporal_ensemble=ensemble, shortcut=ensemble)
    sampler = policy.export_module()
    artifact = PolicyArtifact.from_module(sampler, generic_io_spec(OBS, ACT))
    assert artifact.kind == "flow"
    assert artifact.io_spec.extra[CHUNK_EXTRA_KEY] == {
        "length": 4,
        "exec_steps": 1 if ensemble else 2,
        "temporal_ensemble": ensemble,
    }
    back = PolicyArtifact.from_bytes(artifact.to_bytes(), "mem")
    obs = torch.randn(64, OBS) * 3
    with torch.no_grad():
        assert torch.equal(back.module()(obs), sampler(obs))
        assert back.module()(obs).shape == (64, 4, ACT)
    # The artifact's policy callable acts as the training policy's deterministic act does.
    acted, want = back.policy(), []
    with torch.no_grad():
        for t in range(5):
            want.append(policy.act(obs + t, deterministic=True))
            assert torch.allclose(acted(obs + t), want[-1], atol=1e-6)
    # ONNX: the whole sampler, the chunk as output; "all" writes what fits a flow policy.
    report = export_artifact(back, tmp_path, "all", recorded_obs=obs.numpy())
    assert set(report.formats) == {"onnx"}
    assert report.onnx_max_abs_err is not None and report.onnx_max_abs_err <= 1e-5
    saved = json.loads((tmp_path / POLICY_IO_FILENAME).read_text())
    assert saved["extra"][CHUNK_EXTRA_KEY]["length"] == 4


def test_c_export_of_a_flow_policy_names_the_layer(tmp_path: Path) -> None:
    artifact = PolicyArtifact.from_module(_flow(chunk=3).export_module(), generic_io_spec(OBS, ACT))
    with pytest.raises(EmbodiedError, match=r"velocity layer 0 uses mish.*--format onnx"):
        export_artifact(artifact, tmp_path, "c")
    relu = PolicyArtifact.from_module(_flow(activation="relu").export_module(), generic_io_spec(OBS, ACT))
    with pytest.raises(EmbodiedError, match=r"4 unrolled calls .* one MLP"):
        export_artifact(relu, tmp_path, "c")


def test_deploy_runner_executes_chunks_receding_horizon(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from embodied.real.runner import PolicyRunner

    policy = _flow(chunk=4, exec_steps=3)
    artifact = PolicyArtifact.from_module(policy.export_module(), generic_io_spec(OBS, ACT))
    export_artifact(artifact, tmp_path, "onnx")
    runner = PolicyRunner(tmp_path)
    assert runner.chunk == ChunkSpec(4, 3)
    gen = torch.Generator().manual_seed(1)
    stream = torch.randn(7, OBS, generator=gen) * 2
    with torch.no_grad():
        plans = policy.export_module()(stream)  # [7, H, A]: what a plan at each step would say
    got = np.stack([runner(o.numpy()) for o in stream])
    # steps 0-2 run the plan made at step 0, steps 3-5 the one made at 3, step 6 a new one
    want = torch.stack([plans[0, 0], plans[0, 1], plans[0, 2], plans[3, 0], plans[3, 1], plans[3, 2], plans[6, 0]])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    runner.reset()
    np.testing.assert_allclose(runner(stream[1].numpy()), plans[1, 0].numpy(), atol=1e-5)
    # a policy_io.json whose chunk disagrees with the graph is refused by name
    path = tmp_path / POLICY_IO_FILENAME
    data = json.loads(path.read_text())
    data["extra"][CHUNK_EXTRA_KEY]["length"] = 5
    path.write_text(json.dumps(data))
    with pytest.raises(EmbodiedError, match=r"returns \[batch, 4, 2\].*\[batch, 5, 2\]"):
        PolicyRunner(tmp_path)
