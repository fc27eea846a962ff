"""The ManiSkill3 backend on its physx CPU backend: the VecEnv contract (shapes, seeds, time
limit, auto-reset with final observations), the named errors (unknown id, assets not
downloaded, no Vulkan device, no package) and the bench's raw step.

Skipped, with the set-up command, where ManiSkill or a usable Vulkan driver is missing (the
missing-package error is checked everywhere). Each ManiSkill env object takes a second or more
to build, so the tests share one small env.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from embodied import registry
from embodied.config import ConfigError, apply_overrides
from embodied.env import VecEnv, resumes_exactly
from embodied.errors import MissingDependencyError
from embodied.sim import maniskill

TASK = "maniskill:PushCube-v1"
SETUP = (
    'pip install --no-deps "mani-skill==3.0.1" "sapien==3.0.3" && pip install -e ".[maniskill]"; '
    "apt-get install -t bookworm-backports mesa-vulkan-drivers (docs/backends.md)"
)
N = 2
LIMIT = 4  # a short time limit, so episodes end within a test


def _cfg(**keys: object) -> maniskill.ManiSkillCfg:
    cfg = apply_overrides(registry.task_cfg(TASK), {"max_episode_steps": LIMIT, **keys}, "test")
    assert isinstance(cfg, maniskill.ManiSkillCfg)
    return cfg


def _build(cfg: maniskill.ManiSkillCfg, num_envs: int = N) -> maniskill.ManiSkillVecEnv:
    """The env, or a skip naming the set-up when ManiSkill or its Vulkan driver is missing."""
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    try:
        env = registry.make_env(TASK, cfg, num_envs=num_envs, device="cpu", seed=0)
    except MissingDependencyError as err:
        pytest.skip(f"ManiSkill cannot run here ({err}); set-up: {SETUP}")
    assert isinstance(env, maniskill.ManiSkillVecEnv)
    return env


@pytest.fixture(scope="module")
def env() -> Iterator[maniskill.ManiSkillVecEnv]:
    built = _build(_cfg())
    yield built
    built.close()


def test_contract_shapes_and_specs(env: maniskill.ManiSkillVecEnv) -> None:
    assert isinstance(env, VecEnv) and not resumes_exactly(env)
    assert env.obs_spec == {"policy": (35,)} and env.action_dim == 8  # Panda joint deltas + gripper
    assert env.max_episode_steps == LIMIT and env.dt == pytest.approx(0.05)  # 20 Hz control
    obs = env.reset(seed=3)["policy"]
    assert obs.shape == (N, 35) and obs.dtype == torch.float32 and bool(torch.isfinite(obs).all())
    spec = env.io_spec()
    assert spec.obs_dim == 35 and len(spec.action_fields) == 8 and spec.extra["env_id"] == "PushCube-v1"


def test_reset_seed_reproduces_and_envs_differ(env: maniskill.ManiSkillVecEnv) -> None:
    first = env.reset(seed=11)["policy"]
    again = env.reset(seed=11)["policy"]
    other = env.reset(seed=12)["policy"]
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert not torch.equal(first, other)
    assert not torch.equal(first[0], first[1])  # env i is seeded with seed + i: cube and goal differ


def test_time_limit_truncates_and_auto_resets_with_final_obs(env: maniskill.ManiSkillVecEnv) -> None:
    env.reset(seed=5)
    gen = torch.Generator().manual_seed(0)
    for t in range(LIMIT):
        action = torch.rand((N, env.action_dim), generator=gen) * 2 - 1
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward.shape == (N,) and reward.dtype == torch.float32
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
        assert info["success"].shape == (N,) and info["reward_terms"]["env"].shape == (N,)
        if t < LIMIT - 1:
            assert not bool(truncated.any()) and torch.equal(info["final_obs"]["policy"], obs["policy"])
    assert bool(truncated.all()) and not bool(terminated.any())  # random arms do not push the cube home
    final = info["final_obs"]["policy"]
    # the returned observation is the next episode's first one: the arm is back at its rest pose
    assert (final - obs["policy"]).abs().sum(dim=1).min() > 1e-3
    assert bool((env.episode_step == 0).all())
    obs, *_ = env.step(torch.zeros(N, env.action_dim))
    assert bool((env.episode_step == 1).all())


def _cube_onto_goal(env: maniskill.ManiSkillVecEnv, index: int) -> None:
    """Teleport env ``index``'s cube onto its goal (PushCube's success: cube inside the goal circle)."""
    from mani_skill.utils.structs.pose import Pose

    scene = env.parts[index]
    pose = scene.obj.pose
    p = pose.p.clone()
    p[..., :2] = scene.goal_region.pose.p[..., :2]
    scene.obj.set_pose(Pose.create_from_pq(p=p, q=pose.q))


def test_success_terminates_and_is_reported(env: maniskill.ManiSkillVecEnv) -> None:
    env.reset(seed=2)
    _cube_onto_goal(env, 1)
    obs, _, terminated, truncated, info = env.step(torch.zeros(N, env.action_dim))
    assert terminated.tolist() == [False, True] and not bool(truncated.any())
    assert info["success"].tolist() == [False, True]
    assert not torch.equal(info["final_obs"]["policy"][1], obs["policy"][1])  # env 1 was reset
    assert env.episode_step.tolist() == [1, 0]


def test_success_without_termination_is_reported_at_the_time_limit() -> None:
    env = _build(_cfg(terminate_on_success=False))
    try:
        env.reset(seed=2)
        _cube_onto_goal(env, 0)
        for _ in range(LIMIT):
            _, _, terminated, truncated, info = env.step(torch.zeros(N, env.action_dim))
            assert not bool(terminated.any())
        assert bool(truncated.all()) and info["success"].tolist() == [True, False]
    finally:
        env.close()


def test_state_dict_round_trip_and_wrong_task(env: maniskill.ManiSkillVecEnv) -> None:
    env.reset(seed=0)
    env.step(torch.zeros(N, env.action_dim))
    state = env.state_dict()
    env.reset(seed=0)
    env.load_state_dict(state)
    assert bool((env.episode_step == 1).all())
    with pytest.raises(Exception, match="PickCube-v1"):
        env.load_state_dict({**state, "env_id": "PickCube-v1"})


def test_bench_raw_step_and_ratio() -> None:
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    from embodied.backend_bench import bench_backend_task, parse_target

    assert parse_target(TASK) == ("maniskill", TASK)
    _build(_cfg()).close()  # a skip with the reason when Vulkan is unusable
    result = bench_backend_task(TASK, num_envs=1, device="cpu", steps=5, repeats=1)
    assert result["bench"] == TASK and result["raw_steps_per_s"] > 0
    assert 0.0 < result["ratio_vs_raw"] < 2.0


def test_unknown_env_id_names_the_closest() -> None:
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    cfg = registry.task_cfg("maniskill:PushCub-v1")
    with pytest.raises(ConfigError, match=r"unknown ManiSkill env id 'PushCub-v1'; closest: PushCube-v1"):
        registry.make_env("maniskill:PushCub-v1", cfg, num_envs=1, device="cpu", seed=0)


def test_task_without_downloaded_assets_is_a_named_error_not_a_prompt() -> None:
    """A task whose assets are absent fails at once with the download command (stdin is closed:
    a prompt would raise EOFError instead)."""
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    from mani_skill.utils import assets

    task = "maniskill:RotateSingleObjectInHandLevel2-v1"  # needs the YCB object set
    if assets.is_data_source_downloaded("ycb"):
        pytest.skip("the YCB assets are downloaded here; the error cannot be shown")
    with pytest.raises(MissingDependencyError, match=r"download_asset RotateSingleObjectInHandLevel2-v1"):
        registry.make_env(task, registry.task_cfg(task), num_envs=1, device="cpu", seed=0)


def test_no_vulkan_device_is_a_named_error() -> None:
    """With the Vulkan loader pointed at no driver, building an env names the Vulkan fix."""
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    code = (
        "from embodied import registry\n"
        "from embodied.errors import MissingDependencyError\n"
        f"cfg = registry.task_cfg({TASK!r})\n"
        "try:\n"
        f"    registry.make_env({TASK!r}, cfg, num_envs=1, device='cpu', seed=0)\n"
        "except MissingDependencyError as err:\n"
        "    print('NAMED:', err)\n"
    )
    env_vars = {**os.environ, "VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env_vars,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "NAMED:" in out.stdout, out.stdout + out.stderr
    assert "Vulkan" in out.stdout and "bookworm-backports" in out.stdout


def test_unknown_control_mode_lists_the_supported_ones() -> None:
    pytest.importorskip("mani_skill", reason=f"ManiSkill is not installed: {SETUP}")
    with pytest.raises(ConfigError, match=r"pd_foo not in supported modes: .*pd_ee_delta_pos"):
        _build(_cfg(control_mode="pd_foo"), num_envs=1)


def test_missing_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mani_skill", None)  # an import of it now fails
    with pytest.raises(MissingDependencyError, match=r"mani-skill==3\.0\.1.*embodied\[maniskill\]"):
        registry.make_env(TASK, registry.task_cfg(TASK), num_envs=1, device="cpu", seed=0)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="env_id is empty"):
        maniskill.ManiSkillCfg()
    with pytest.raises(ConfigError, match="reward_mode"):
        maniskill.ManiSkillCfg(env_id="PushCube-v1", reward_mode="shaped")
    with pytest.raises(ConfigError, match="num_envs"):
        maniskill.ManiSkillVecEnv(maniskill.ManiSkillCfg(env_id="PushCube-v1"), num_envs=0, device="cpu", seed=0)


@pytest.mark.slow
def test_ppo_learns_pushcube_past_random(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PPO with the shipped config (16 physx CPU scenes, end-effector control, dense reward) for
    9,600 env steps. A uniform-random policy scores a mean return of 2.5 over 64 episodes (best
    single episode 7.0) and never succeeds; the trained policy's deterministic mean return over 16
    episodes must beat that best episode (docs/benchmarks/maniskill.md has the full run)."""
    _build(_cfg()).close()  # a skip with the reason when ManiSkill cannot run here
    assert train_eval_return(tmp_path, capsys) > 7.0


def train_eval_return(tmp_path: Path, capsys: pytest.CaptureFixture[str], *keys: str) -> float:
    """PPO with the shipped PushCube config and ``keys`` for 9,600 env steps (seed 0): the
    deterministic mean return of 16 eval episodes."""
    from embodied.cli import main

    args = [
        "train", TASK, "--run-dir", str(tmp_path / "run"), "--no-progress", "--seed", "0",
        "trainer.total_env_steps=9600", "trainer.eval_every_env_steps=0", "trainer.eval_episodes=16", *keys,
    ]  # fmt: skip
    assert main(args) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("eval:"))
    return float(line.split("mean_return")[1].split()[0])
