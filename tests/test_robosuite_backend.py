"""The robosuite backend (``sim/robosuite.py``).

robosuite 1.5.2 needs mujoco <= 3.9, so its tests run in their own environment:
``bash scripts/setup_robosuite.sh && .venv-robosuite/bin/python -m pytest tests/test_robosuite_backend.py``
(``scripts/test.sh`` does both). In the core environment the adapter tests skip with that
reason, and the tests of what the core environment sees (the named error, config checks, the
bench target, old configs without the camera keys) run instead. The camera tests render through
robosuite's offscreen renderer (EGL here, Mesa's llvmpipe without a GPU) at 40x40 px.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from env_support import load_config_saved_before_camera_keys, repeated_image_rollouts

from embodied import registry
from embodied.config import ConfigError
from embodied.env import IMAGE_GROUP, RenderingEnv, renders_images
from embodied.errors import MissingDependencyError
from embodied.sim.robosuite import SETUP, RobosuiteBackendCfg, RobosuiteCfg, RobosuiteVecEnv, import_robosuite

HAVE_ROBOSUITE = importlib.util.find_spec("robosuite") is not None
needs_robosuite = pytest.mark.skipif(
    not HAVE_ROBOSUITE, reason=f"robosuite is not installed here; its environment comes from {SETUP}"
)

N = 2
HORIZON = 3


# ----------------------------------------------------------------- without robosuite (core env)
@pytest.mark.skipif(HAVE_ROBOSUITE, reason="robosuite is installed here: the missing-package error cannot happen")
def test_missing_robosuite_names_the_setup_command() -> None:
    with pytest.raises(MissingDependencyError, match=r"scripts/setup_robosuite\.sh"):
        registry.make_env("robosuite:Lift", registry.task_cfg("robosuite:Lift"), 1, "cpu", seed=0)
    with pytest.raises(MissingDependencyError, match=r"scripts/setup_robosuite\.sh"):
        import_robosuite()


def test_config_is_checked() -> None:
    cfg = registry.task_cfg("robosuite:Door")
    assert isinstance(cfg, RobosuiteCfg) and cfg.env_name == "Door" and cfg.robot == "Panda"
    with pytest.raises(ConfigError, match="robosuite:<Env>"):
        RobosuiteCfg(env_name="")
    with pytest.raises(ConfigError, match=r"env\.horizon"):
        RobosuiteCfg(env_name="Lift", horizon=0)
    with pytest.raises(ConfigError, match=r"env\.control_freq"):
        RobosuiteCfg(env_name="Lift", control_freq=0)


def test_bench_target_keeps_the_task_name() -> None:
    from embodied.backend_bench import parse_target

    assert parse_target("robosuite:Lift") == ("robosuite", "robosuite:Lift")
    assert registry.task_backends("robosuite:Stack") == ["robosuite"]


# ------------------------------------------------------------------ with robosuite (its own env)
@pytest.fixture(scope="module")
def lift() -> Iterator[RobosuiteVecEnv]:
    cfg = RobosuiteCfg(env_name="Lift", horizon=HORIZON)
    env = registry.make_env("robosuite:Lift", cfg, N, "cpu", seed=0)
    assert isinstance(env, RobosuiteVecEnv)
    yield env
    env.close()


@needs_robosuite
def test_shapes_and_spaces(lift: RobosuiteVecEnv) -> None:
    obs = lift.reset(seed=0)
    assert set(obs) == {"policy"}
    # robot0 proprio (joints, end-effector pose, gripper) 50 + Lift's cube state 10
    assert lift.obs_spec == {"policy": (60,)} and obs["policy"].shape == (N, 60)
    assert obs["policy"].dtype == torch.float32 and torch.isfinite(obs["policy"]).all()
    assert lift.action_dim == 7 and lift.dt == pytest.approx(0.05) and lift.max_episode_steps == HORIZON
    spec = lift.io_spec()
    assert [f.name for f in spec.obs_fields] == ["robot0_proprio_state", "object_state"]
    assert sum(f.size for f in spec.obs_fields) == 60 and len(spec.action_fields) == 7
    obs, reward, terminated, truncated, info = lift.step(torch.zeros(N, 7))
    assert reward.shape == terminated.shape == truncated.shape == info["success"].shape == (N,)
    assert terminated.dtype == truncated.dtype == torch.bool and reward.dtype == torch.float32
    assert (reward > 0).all()  # the dense reaching term is positive everywhere
    with pytest.raises(ValueError, match=r"\[2, 7\]"):
        lift.step(torch.zeros(N, 6))


@needs_robosuite
def test_truncates_at_the_horizon_with_final_obs(lift: RobosuiteVecEnv) -> None:
    first = lift.reset(seed=1)["policy"]
    push = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]]).expand(N, 7)  # move the hand along +x
    for step in range(1, HORIZON + 1):
        obs, _, terminated, truncated, info = lift.step(push)
        assert not terminated.any()
        if step < HORIZON:
            assert not truncated.any()
            assert torch.equal(info["final_obs"]["policy"], obs["policy"])  # no env ended
            last = obs["policy"]
    assert truncated.all() and not info["success"].any()
    final = info["final_obs"]["policy"]
    # the final observation continues the episode (hand moved further along +x) ...
    eef_x = 35  # robot0_eef_pos follows joint positions, cos, sin, velocities, accelerations (7 each)
    assert (final[:, eef_x] > last[:, eef_x]).all()
    # ... and the returned one is the next episode's start, near where the first episode began
    assert (obs["policy"][:, eef_x] - first[:, eef_x]).abs().max() < (final[:, eef_x] - first[:, eef_x]).abs().min()
    assert (lift.episode_step == 0).all()


@needs_robosuite
def test_seeds_reproduce_and_differ_per_env(lift: RobosuiteVecEnv) -> None:
    a = lift.reset(seed=7)["policy"]
    b = lift.reset(seed=7)["policy"]
    c = lift.reset(seed=8)["policy"]
    assert torch.equal(a, b)
    cube = slice(50, 53)  # the cube's position, first in Lift's object state
    assert not torch.equal(a[0, cube], a[1, cube])  # env i draws from seed + i
    assert not torch.equal(a[:, cube], c[:, cube])


@needs_robosuite
def test_success_comes_from_check_success() -> None:
    cfg = RobosuiteCfg(env_name="Lift", horizon=50, terminate_on_success=True)
    env = RobosuiteVecEnv(cfg, num_envs=N, device="cpu", seed=0)
    try:
        env.reset(seed=0)
        obs, _, terminated, truncated, info = env.step(torch.zeros(N, 7))
        assert not terminated.any() and not info["success"].any()
        # lift env 1's cube 20 cm above the table: robosuite's _check_success (height > table + 4 cm)
        inner = env.envs[1]
        joint = inner.cube.joints[0]
        qpos = inner.sim.data.get_joint_qpos(joint).copy()
        qpos[2] += 0.2
        inner.sim.data.set_joint_qpos(joint, qpos)
        inner.sim.forward()
        assert inner._check_success()
        obs, _, terminated, truncated, info = env.step(torch.zeros(N, 7))
        assert terminated.tolist() == [False, True] and not truncated.any()
        assert info["success"].tolist() == [False, True]
        # the final observation holds the raised cube; the returned one a fresh episode's cube on the table
        cube_z = 52
        assert info["final_obs"]["policy"][1, cube_z] > obs["policy"][1, cube_z] + 0.1
    finally:
        env.close()


@needs_robosuite
@pytest.mark.parametrize("name, object_dim", [("Stack", 23), ("Door", 14)])
def test_stack_and_door_build(name: str, object_dim: int) -> None:
    env = registry.make_env(f"robosuite:{name}", registry.task_cfg(f"robosuite:{name}"), 1, "cpu", seed=0)
    try:
        assert env.obs_spec == {"policy": (50 + object_dim,)} and env.action_dim == 7
        obs, reward, *_ = env.step(torch.zeros(1, 7))
        assert obs["policy"].shape == (1, 50 + object_dim) and torch.isfinite(reward).all()
    finally:
        env.close()


@needs_robosuite
def test_unknown_environment_and_robot_are_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown robosuite environment 'Lfit'.*Lift"):
        RobosuiteVecEnv(RobosuiteCfg(env_name="Lfit"), num_envs=1, device="cpu", seed=0)
    with pytest.raises(ConfigError, match=r"unknown robosuite robot 'Pandas'.*Panda"):
        RobosuiteVecEnv(RobosuiteCfg(env_name="Lift", robot="Pandas"), num_envs=1, device="cpu", seed=0)


@needs_robosuite
def test_bench_reports_ratio_vs_raw() -> None:
    from embodied.backend_bench import bench_backend_task

    result = bench_backend_task("robosuite:Lift", num_envs=1, device="cpu", steps=3, repeats=1)
    assert result["bench"] == "robosuite:Lift" and result["steps_per_s"] > 0 and result["raw_steps_per_s"] > 0
    assert 0.0 < result["ratio_vs_raw"] < 1.5  # the task step contains the raw step (timing noise aside)


@needs_robosuite
def test_trains_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied.cli import main

    run_dir = tmp_path / "run"
    args = [
        "train", "robosuite:Lift", "--algo", "sac", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "2",
        "env.horizon=10", "algo.learning_starts=20", "algo.batch_size=16", "trainer.total_env_steps=40",
        "trainer.eval_every_env_steps=0", "trainer.eval_episodes=2",
    ]  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(run_dir)
    assert "env_name: Lift" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "metrics.jsonl").read_text().strip()


# ------------------------------------------------------------- camera images (its own env)
CAMERA = "agentview"
SIZE_PX = 40  # the CNN encoder needs >= 36 px


@pytest.fixture(scope="module")
def lift_camera() -> Iterator[RobosuiteVecEnv]:
    cfg = RobosuiteCfg(env_name="Lift", horizon=HORIZON, backend=RobosuiteBackendCfg(CAMERA, SIZE_PX))
    env = registry.make_env("robosuite:Lift", cfg, N, "cpu", seed=0)
    assert isinstance(env, RobosuiteVecEnv)
    yield env
    env.close()


def test_camera_keys_are_checked_and_the_registry_says_robosuite_renders() -> None:
    cfg = registry.task_cfg("robosuite:Lift")
    assert isinstance(cfg, RobosuiteCfg) and cfg.backend == RobosuiteBackendCfg("", 64)
    with pytest.raises(ConfigError, match="image_size_px"):
        RobosuiteBackendCfg(CAMERA, 4)
    assert registry.BACKENDS["robosuite"].renders


def test_runs_saved_before_the_camera_keys_load(tmp_path: Path) -> None:
    """A robosuite config.yaml without ``env.backend`` loads with the camera off."""
    loaded = load_config_saved_before_camera_keys(tmp_path, "robosuite:Lift", "sac")
    assert loaded.env.backend.camera == "" and loaded.env.backend.image_size_px == 64


@needs_robosuite
def test_image_group_shape_dtype_and_final_obs(lift_camera: RobosuiteVecEnv, lift: RobosuiteVecEnv) -> None:
    env = lift_camera
    assert env.obs_spec == {"policy": (60,), IMAGE_GROUP: (SIZE_PX, SIZE_PX, 3)}
    assert isinstance(env, RenderingEnv) and renders_images(env) and not renders_images(lift)
    obs = env.reset(seed=3)
    image = obs[IMAGE_GROUP]
    assert image.shape == (N, SIZE_PX, SIZE_PX, 3) and image.dtype == torch.uint8
    assert image[0].float().std() > 10  # a picture (table, arm, cube), not a flat fill
    assert torch.equal(env.render_images(), image)  # the observation's orientation is render_images'
    # the state vector is the state-only env's for the same seed
    torch.testing.assert_close(lift.reset(seed=3)["policy"], obs["policy"], rtol=0, atol=0)
    push = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]]).expand(N, 7)
    for _ in range(HORIZON - 1):
        obs, _, _, truncated, info = env.step(push)
        assert not truncated.any() and torch.equal(info["final_obs"][IMAGE_GROUP], obs[IMAGE_GROUP])
    last = obs[IMAGE_GROUP]
    obs, _, _, truncated, info = env.step(push)
    assert truncated.all()
    final = info["final_obs"][IMAGE_GROUP]
    assert final.shape == (N, SIZE_PX, SIZE_PX, 3) and final.dtype == torch.uint8
    assert torch.equal(obs[IMAGE_GROUP], env.render_images())  # the new episodes' first pictures
    for i in range(N):
        assert not torch.equal(final[i], obs[IMAGE_GROUP][i])  # the ended state, not the reset one
        assert not torch.equal(final[i], last[i])  # the arm moved on in the last step
    with pytest.raises(RuntimeError, match=r"env\.backend\.camera"):
        lift.render_images()


@needs_robosuite
def test_images_differ_between_states_and_repeat_for_equal_states(lift_camera: RobosuiteVecEnv) -> None:
    runs = repeated_image_rollouts(lift_camera, steps=HORIZON - 1)  # no episode ends
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)  # same seed and actions: the same pixels
    first, last = runs[0][0], runs[0][-1]
    for i in range(N):
        assert not torch.equal(first[i], last[i])  # the arm moved: another picture
    assert not torch.equal(first[0], first[1])  # env i is seeded with seed + i: another cube place


@needs_robosuite
def test_images_are_upright_as_mujocos_renderer_draws_them(lift_camera: RobosuiteVecEnv) -> None:
    """robosuite's default image convention ("opengl") hands rows bottom-up; the env's images match
    ``mujoco.Renderer`` (row 0 at the top) of the same state, not their upside-down copy. The two
    renderers differ in details (robosuite's own GL context), so this compares mean distances."""
    import mujoco

    env = lift_camera
    ours = env.reset(seed=0)[IMAGE_GROUP][0].numpy().astype(np.float64)
    inner = env.envs[0]
    with mujoco.Renderer(inner.sim.model._model, SIZE_PX, SIZE_PX) as renderer:
        renderer.update_scene(inner.sim.data._data, CAMERA)
        reference = renderer.render().astype(np.float64)
    upright, flipped = np.abs(ours - reference).mean(), np.abs(ours[::-1] - reference).mean()
    assert upright < flipped / 3, (upright, flipped)


@needs_robosuite
def test_unknown_camera_lists_the_cameras() -> None:
    cfg = RobosuiteCfg(env_name="Lift", backend=RobosuiteBackendCfg("side"))
    with pytest.raises(ConfigError, match=r"no camera 'side' \(env\.backend\.camera; its cameras: .*agentview"):
        RobosuiteVecEnv(cfg, num_envs=1, device="cpu", seed=0)


@needs_robosuite
def test_ppo_cnn_trains_and_exports_onnx(lift_camera: RobosuiteVecEnv, tmp_path: Path) -> None:
    """PPO with ``algo.encoder=cnn`` on Lift's camera through the CLI for two short iterations, its
    ONNX export, and the exported graph on onnxruntime acting like the torch policy on robosuite's
    pictures (the export's own rollout is skipped: it would build four more robosuite envs)."""
    pytest.importorskip("onnxruntime", reason=f"the ONNX check needs onnxruntime: {SETUP}")
    from embodied.cli import main
    from embodied.export.image_onnx import IMAGE_INPUT_KEY, load_image_onnx_policy
    from embodied.training.run import load_run

    run_dir = tmp_path / "run"
    args = [
        "train", "robosuite:Lift", "--algo", "ppo", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "1",
        f"env.backend.camera={CAMERA}", f"env.backend.image_size_px={SIZE_PX}", "env.horizon=4",
        "algo.encoder=cnn", "algo.num_steps_per_env=4", "algo.num_minibatches=2", "trainer.total_env_steps=8",
        "trainer.eval_every_env_steps=0", "trainer.eval_episodes=0", "trainer.torch_threads=1",
    ]  # fmt: skip
    assert main(args) == 0
    assert main(["export", str(run_dir), "--format", "onnx", "--no-record"]) == 0
    policy_io = json.loads((run_dir / "export" / "policy_io.json").read_text())
    image_input = policy_io[IMAGE_INPUT_KEY]
    assert image_input["shape"] == ["batch", SIZE_PX, SIZE_PX, 3] and image_input["camera"] == CAMERA
    module = load_run(run_dir).policy.export_module()
    onnx_act = load_image_onnx_policy(run_dir / "export", lift_camera)
    obs = lift_camera.reset(seed=0)
    with torch.inference_mode():
        torch_action = module(obs["policy"], obs[IMAGE_GROUP])
        dark_action = module(obs["policy"], torch.zeros_like(obs[IMAGE_GROUP]))
    torch.testing.assert_close(onnx_act(obs), torch_action, rtol=0, atol=1e-5)
    assert not torch.allclose(torch_action, dark_action)  # the policy reads the camera
