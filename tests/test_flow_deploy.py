"""A flow policy exported to ONNX runs through the deploy node on arm-push: the node rebuilds the
task's observation from ROS 2 messages (real/robots/arm_push_sim.yaml), executes the action
chunks receding-horizon at the trained period, and commands what the export computes on the
task's own observation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flow_deploy_support import fly_arm_push

from embodied import registry
from embodied.export.artifact import PolicyArtifact
from embodied.export.bundle import export_artifact
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg


@pytest.mark.parametrize(("exec_steps", "ensemble"), [(2, False), (1, True)])
def test_flow_policy_flies_arm_push_through_the_node(tmp_path: Path, exec_steps: int, ensemble: bool) -> None:
    pytest.importorskip("onnxruntime")
    env = registry.make_env("arm-push", registry.task_cfg("arm-push"), 64, "cpu", 0)
    obs = env.reset(seed=0)["policy"]
    spec = env.io_spec()
    env.close()
    torch.manual_seed(0)
    cfg = FlowPolicyCfg(hidden=(32, 32), chunk=4, exec_steps=exec_steps, temporal_ensemble=ensemble)
    policy = FlowPolicy(obs.shape[1], spec.action_dim, cfg)
    policy.set_obs_stats(obs.mean(0), obs.std(0))
    export_artifact(PolicyArtifact.from_module(policy.export_module(), spec), tmp_path, "onnx")
    result = fly_arm_push(tmp_path, episodes=2, seed=3)
    assert result.episodes == 2 and result.steps >= 2
    assert result.rejections == 0
    # the node's observation is the task's (float64 message arithmetic vs the task's float32)
    assert result.max_action_diff <= 1e-4, result
