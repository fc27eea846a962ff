"""An image-instruction flow policy (camera, instruction, proprioception -> action chunk) through the deploy
node: the export carries its training instruction's embedding, the node feeds it (or embeds the
robot config's ``instruction:``), and flies arm-push on the rendered camera commanding what the
export computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flow_deploy_support import ARM_ROBOT, fly_arm_push
from real_support import write_robot_variant
from test_real_camera import CAMERA_INPUT

from embodied.cli import main
from embodied.env import IMAGE_GROUP
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.transports.memory import MemoryTransport
from embodied.training.run import load_run

pytest.importorskip("wordllama", reason='the instruction text model: pip install "embodied[instruction]"')
pytest.importorskip("onnxruntime")

INSTRUCTION = "push the block to the goal"


@pytest.fixture(scope="module")
def vla_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny camera image-instruction bc-flow run, exported to ONNX."""
    root = tmp_path_factory.mktemp("vla_deploy")
    demos, run = root / "demos", root / "bc"
    argv = ["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--images", "--camera", "top"]
    assert main([*argv, "--out", str(demos)]) == 0
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(run)]
    argv += ["--num-envs", "2", "--no-progress", "trainer.eval_episodes=1", "trainer.torch_threads=1"]
    argv += ["algo.policy.hidden=[32,32]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
    argv += [f"algo.policy.instruction={INSTRUCTION}", "env.backend.camera=top", "trainer.total_env_steps=4"]
    assert main(argv) == 0
    assert main(["export", str(run), "--format", "onnx", "--no-record"]) == 0
    return run


def _camera_robot(tmp_path: Path, instruction: str | None = None) -> Path:
    edits: dict[str, object] = {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}}
    if instruction is not None:
        edits["instruction"] = instruction
    return write_robot_variant(tmp_path, ARM_ROBOT, edits)


def test_the_export_runs_with_its_training_instruction_like_the_torch_policy(vla_run: Path) -> None:
    loaded = load_run(vla_run)
    env = loaded.make_env(1, seed=5)
    obs = env.reset(seed=5)
    env.close()
    runner = PolicyRunner(vla_run)
    assert runner.reads_instruction and runner.image_shape == tuple(obs[IMAGE_GROUP].shape[1:])
    # the torch policy's first action of a fresh plan from the same observation and picture
    want = loaded.policy.export_module()(
        obs[IMAGE_GROUP], loaded.policy.export_module().instruction_embedding[None], obs["policy"]
    )[0, 0]
    got = runner(obs["policy"][0].numpy(), obs[IMAGE_GROUP][0].numpy())
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=1e-5)


def test_the_node_flies_it_on_the_camera_and_takes_the_robot_configs_instruction(vla_run: Path, tmp_path: Path) -> None:
    from embodied.policies.text_table import embed_instruction_array

    env = load_run(vla_run).make_env(1, seed=3)
    result = fly_arm_push(vla_run / "export", episodes=1, seed=3, robot_path=_camera_robot(tmp_path), env=env)
    assert result.episodes == 1 and result.steps >= 10 and result.rejections == 0
    assert result.max_action_diff <= 1e-4, result

    default, same, other = PolicyRunner(vla_run), PolicyRunner(vla_run), PolicyRunner(vla_run)
    PolicyNode(MemoryTransport(), load_robot(_camera_robot(tmp_path, INSTRUCTION)), same)
    PolicyNode(MemoryTransport(), load_robot(_camera_robot(tmp_path, "pull the block back")), other)
    np.testing.assert_array_equal(same.instruction, default.instruction)  # the export's own
    np.testing.assert_array_equal(other.instruction, embed_instruction_array("pull the block back"))
    obs, image = np.zeros(18, dtype=np.float32), np.full((64, 64, 3), 90, dtype=np.uint8)
    assert not np.allclose(other(obs, image), default(obs, image), atol=1e-6)  # the instruction matters
