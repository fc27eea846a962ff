"""Arm-push task: kinematics match the model, the scripted expert solves it, random play does not."""

from __future__ import annotations

from typing import Literal

import mujoco
import numpy as np
import pytest
import torch

from embodied.tasks.arm_push import ArmPush, ArmPushCfg, fingertip_jacobian, fingertip_pos
from embodied.tasks.arm_push_expert import ScriptedExpert


def _success_rate(env: ArmPush, act, seed: int) -> float:
    """First-episode success of every env (``act``: obs -> action)."""
    obs = env.reset(seed=seed)
    n = env.num_envs
    ended = np.zeros(n, dtype=bool)
    success = np.zeros(n, dtype=bool)
    for _ in range(env.max_episode_steps):
        obs, _, term, trunc, info = env.step(act(obs))
        first = (term | trunc).numpy() & ~ended
        success[first] = info["success"].numpy()[first]
        ended |= (term | trunc).numpy()
    assert ended.all()
    return float(success.mean())


def test_forward_kinematics_matches_mujoco() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)
    data = mujoco.MjData(env.model)
    rng = np.random.default_rng(0)
    for _ in range(5):
        data.qpos[:3] = rng.uniform(-1.5, 1.5, 3)
        mujoco.mj_forward(env.model, data)
        assert np.allclose(fingertip_pos(data.qpos[:3]), data.site("tip").xpos[:2], atol=1e-9)
        jac_pos = np.zeros((3, env.model.nv))
        mujoco.mj_jacSite(env.model, data, jac_pos, None, data.site("tip").id)
        assert np.allclose(fingertip_jacobian(data.qpos[:3]), jac_pos[:2, :3], atol=1e-9)


def test_scripted_expert_solves_it() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=100, device="cpu", seed=3)
    assert _success_rate(env, ScriptedExpert().act, seed=11) >= 0.95


def test_random_actions_do_not() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=100, device="cpu", seed=3)
    gen = torch.Generator().manual_seed(0)
    assert _success_rate(env, lambda obs: torch.rand(100, 3, generator=gen) * 2 - 1, seed=11) < 0.2


@pytest.mark.parametrize("reward", ["sparse", "dense"])
def test_reward_variants(reward: Literal["sparse", "dense"]) -> None:
    env = ArmPush(ArmPushCfg(reward=reward), num_envs=8, device="cpu", seed=0)
    env.reset(seed=0)
    _, r, _, _, info = env.step(torch.zeros(8, 3))
    if reward == "sparse":
        assert set(info["reward_terms"]) == {"success"} and bool((r == 0).all())
    else:
        assert {"reach", "push"} <= set(info["reward_terms"]) and bool((r < 0).all())


def test_goal_is_state_and_stays_put() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)
    obs = env.reset(seed=5)
    goal = obs["policy"][:, 12:14].clone()
    for _ in range(10):
        obs, *_ = env.step(torch.ones(4, 3))
    assert torch.equal(obs["policy"][:, 12:14], goal)
    dist = torch.linalg.norm(obs["policy"][:, 14:16], dim=1)
    assert bool((dist > 0.03).all())
