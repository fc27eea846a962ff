"""The Isaac Lab adapter (sim/isaaclab.py) against a stand-in of ManagerBasedRLEnv in the core
environment (tests/isaaclab_standin.py, limits written there). The same behaviours are checked
against the real Isaac Lab 3.0 in .venv-isaaclab by tests/test_isaaclab_real.py, and on CUDA by
the ``gpu``-marked test here."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")

from isaaclab_standin import StandInRLEnv

from embodied import registry
from embodied.cli import main
from embodied.env import VecEnv, final_obs_exact, resumes_exactly
from embodied.errors import EmbodiedError, MissingDependencyError
from embodied.sim.isaaclab import IsaacLabCfg, IsaacLabVecEnv, make_isaaclab_env

N = 4


def test_groups_map_to_policy_and_critic() -> None:
    env = IsaacLabVecEnv.wrap(StandInRLEnv(N), seed=0)
    assert isinstance(env, VecEnv) and not resumes_exactly(env)
    assert env.obs_spec == {"policy": (3,), "critic": (4,)}
    assert (env.num_envs, env.action_dim, env.dt, env.max_episode_steps) == (N, 1, 0.05, 50)
    obs, reward, terminated, truncated, info = env.step(torch.zeros(N, 1))
    assert obs["policy"].shape == (N, 3) and obs["critic"].shape == (N, 4)
    assert obs["policy"].dtype == torch.float32 and reward.shape == (N,)
    assert terminated.dtype == truncated.dtype == torch.bool
    torch.testing.assert_close(info["reward_terms"]["total"], reward)
    assert env.io_spec().obs_dim == 3 and env.io_spec().action_dim == 1
    # a task with only a policy group: the critic reads the policy observation
    only_policy = IsaacLabVecEnv.wrap(StandInRLEnv(N), IsaacLabCfg(task_id="x", critic_group="none"))
    assert only_policy.obs_spec == {"policy": (3,)}


def test_time_outs_truncate_and_final_obs_is_the_pre_reset_observation() -> None:
    standin = StandInRLEnv(N, max_episode_length=3)
    env = IsaacLabVecEnv.wrap(standin, seed=1)
    zero = torch.zeros(N, 1)
    for _ in range(2):
        _, _, terminated, truncated, info = env.step(zero)
        assert not (terminated | truncated).any()
        before = dict(standin._obs())
    obs, _, terminated, truncated, info = env.step(zero)
    assert truncated.all() and not terminated.any()
    # the returned observation is the reset one (progress 0), final_obs the one the episode ended on
    assert (obs["policy"][:, 2] == 0).all()
    final = info["final_obs"]
    torch.testing.assert_close(final["policy"][:, 2], torch.ones(N))
    assert not torch.allclose(final["policy"][:, :2], before["policy"][:, :2])  # one more step moved them
    assert final["critic"].shape == (N, 4)
    assert env.exact_final_obs and final_obs_exact(env)


def test_termination_wins_over_a_time_out_on_the_same_step() -> None:
    standin = StandInRLEnv(N, max_episode_length=1)
    env = IsaacLabVecEnv.wrap(standin, seed=0)
    standin.x[:] = torch.tensor([3.0, 0.0, 3.0, 0.0])  # rows 0 and 2 leave |x| <= 2 this step
    _, _, terminated, truncated, _ = env.step(torch.zeros(N, 1))
    assert terminated.tolist() == [True, False, True, False]
    assert truncated.tolist() == [False, True, False, True]


def test_without_final_obs_the_adapter_says_so(caplog: pytest.LogCaptureFixture) -> None:
    env = IsaacLabVecEnv.wrap(StandInRLEnv(N, max_episode_length=2, compute_final_obs=False), seed=0)
    with caplog.at_level(logging.WARNING, logger="embodied.sim.isaaclab"):
        env.step(torch.zeros(N, 1))
        assert env.exact_final_obs
        obs, _, _, truncated, info = env.step(torch.zeros(N, 1))
    assert truncated.all() and not env.exact_final_obs and not final_obs_exact(env)
    assert "compute_final_obs=True" in caplog.text
    torch.testing.assert_close(info["final_obs"]["policy"], obs["policy"])


def test_actions_are_clipped_then_mapped_onto_a_bounded_space() -> None:
    standin = StandInRLEnv(2)
    env = IsaacLabVecEnv.wrap(standin, seed=0)
    env.step(torch.tensor([[0.5], [7.0]]))
    # unbounded space: Isaac Lab's action term scales; the adapter only clips to [-1, 1]
    torch.testing.assert_close(standin.received_actions[-1], torch.tensor([[0.5], [1.0]]))
    bounded = StandInRLEnv(2, bounded_actions=True)
    env = IsaacLabVecEnv.wrap(bounded, seed=0)
    env.step(torch.tensor([[0.5], [-7.0]]))
    torch.testing.assert_close(bounded.received_actions[-1], torch.tensor([[1.5], [-3.0]]))
    assert env.io_spec().action_fields[0].scale == 3.0
    with pytest.raises(ValueError, match=r"action must be \[2, 1\]"):
        env.step(torch.zeros(2, 2))


def test_outputs_are_copies_of_the_reused_buffers() -> None:
    standin = StandInRLEnv(N, max_episode_length=2)
    env = IsaacLabVecEnv.wrap(standin, seed=0)
    _, reward, terminated, truncated, _ = env.step(torch.zeros(N, 1))
    kept = (reward.clone(), terminated.clone(), truncated.clone())
    env.step(torch.zeros(N, 1))  # the time-out step: the stand-in's buffers change in place
    assert standin.reset_time_outs.all()
    torch.testing.assert_close((reward, terminated, truncated), kept)


def test_missing_group_is_a_named_error() -> None:
    with pytest.raises(EmbodiedError, match=r"no observation group 'actor'.*\['policy', 'critic'\]"):
        IsaacLabVecEnv.wrap(StandInRLEnv(N), IsaacLabCfg(task_id="x", policy_group="actor"))


def test_without_isaac_lab_the_error_names_its_install() -> None:
    try:
        import isaaclab  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Isaac Lab is installed here")
    with pytest.raises(MissingDependencyError, match=r"scripts/setup_isaaclab\.sh"):
        make_isaaclab_env(IsaacLabCfg(task_id="Isaac-Cartpole-Direct"), 2, torch.device("cpu"), 0)
    with pytest.raises(MissingDependencyError, match=r"docs/backends\.md"):
        registry.make_env(
            "isaaclab:Isaac-Cartpole-Direct", registry.task_cfg("isaaclab:Isaac-Cartpole-Direct"), 2, "cpu", 0
        )


def test_trains_through_the_shared_trainer_on_the_standin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main([
        "train", "isaaclab:StandIn-v0", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "8",
        "env.factory=isaaclab_standin:make_standin",
        "trainer.total_env_steps=2048", "trainer.eval_every_env_steps=0", "trainer.eval_episodes=8",
    ])  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(run_dir)
    assert "task_id: StandIn-v0" in (run_dir / "config.yaml").read_text()


@pytest.mark.gpu
def test_real_isaac_lab_cartpole_steps_through_the_adapter() -> None:
    """Kit-less Isaac Lab 3 (Newton) on CUDA, in .venv-isaaclab."""
    pytest.importorskip("isaaclab", reason="needs Isaac Lab: bash scripts/setup_isaaclab.sh (docs/backends.md)")
    from embodied.config import apply_overrides

    name = "isaaclab:Isaac-Cartpole-Direct"
    cfg = apply_overrides(registry.task_cfg(name), {"asset_root": "builtin"}, "test")
    env = registry.make_env(name, cfg, 16, "cuda", seed=0)
    try:
        assert isinstance(env, VecEnv) and "policy" in env.obs_spec
        ended = torch.zeros(16, dtype=torch.bool, device=env.device)
        for _ in range(env.max_episode_steps + 1):
            obs, reward, terminated, truncated, _ = env.step(torch.zeros(16, env.action_dim, device=env.device))
            assert obs["policy"].device.type == "cuda" and torch.isfinite(reward).all()
            ended |= terminated | truncated
        assert ended.all(), "every episode ends within max_episode_steps"
    finally:
        env.close()
