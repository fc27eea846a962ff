"""gymnasium <-> embodied adapters: Pendulum and CartPole through ``gym:<id>``, env_checker on
the reverse direction, and the unknown-id error."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
import torch

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from embodied import registry  # noqa: E402
from embodied.config import ConfigError  # noqa: E402
from embodied.env import VecEnv  # noqa: E402
from embodied.sim.gymnasium import (  # noqa: E402
    GymnasiumCfg,
    GymnasiumVecEnv,
    to_gymnasium,
    to_gymnasium_env,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*Box observation space.*infinity")


def test_pendulum_actions_are_rescaled_and_time_limit_truncates() -> None:
    env = registry.make_env("gym:Pendulum-v1", registry.task_cfg("gym:Pendulum-v1"), 2, "cpu", seed=5)
    assert isinstance(env, GymnasiumVecEnv)
    assert (env.action_space_kind, env.action_dim, env.obs_spec["policy"]) == ("box", 1, (3,))
    assert isinstance(env, VecEnv)  # the protocol, checked at run time
    assert env.dt == pytest.approx(0.05)
    ref = gymnasium.make("Pendulum-v1")
    ref_obs, _ = ref.reset(seed=5)  # make_vec seeds env i with seed + i
    np.testing.assert_allclose(env.reset(seed=5)["policy"][0].numpy(), ref_obs, rtol=1e-6)
    for step in range(200):
        # normalized 0.5 -> torque 1.0 N·m of the [-2, 2] range
        ref_obs, ref_reward, _, ref_trunc, _ = ref.step(np.array([1.0], dtype=np.float32))
        obs, reward, terminated, truncated, info = env.step(torch.full((2, 1), 0.5))
        assert reward[0].item() == pytest.approx(ref_reward, rel=1e-5, abs=1e-5)
        assert not terminated.any()
        assert bool(truncated[0]) == ref_trunc == (step == 199)
    final = info["final_obs"]["policy"][0].numpy()
    np.testing.assert_allclose(final, ref_obs, rtol=1e-5, atol=1e-6)
    assert np.abs(final - obs["policy"][0].numpy()).max() > 1e-3  # already the next episode


@pytest.mark.parametrize("vectorization", ["sync", "vector_entry_point"])
def test_discrete_cartpole_is_marked_and_resets_only_ended_envs(
    vectorization: Literal["sync", "vector_entry_point"],
) -> None:
    env = GymnasiumVecEnv(GymnasiumCfg(env_id="CartPole-v1", vectorization=vectorization), 3, "cpu", seed=0)
    assert (env.action_space_kind, env.num_actions, env.action_dim) == ("discrete", 2, 1)
    push_left = torch.zeros(3, dtype=torch.long)
    ended = None
    for _ in range(100):
        obs, _, terminated, truncated, info = env.step(push_left)
        if terminated.any():
            ended = terminated
            break
    assert ended is not None and not truncated.any()
    final = info["final_obs"]["policy"]
    for i in range(3):
        if ended[i]:
            assert final[i, 2].abs() > 0.2  # pole angle past the 12 degree limit
            assert obs["policy"][i].abs().max() <= 0.05  # a fresh reset state
        else:
            assert torch.equal(final[i], obs["policy"][i])


def test_reverse_adapter_passes_env_checker_for_a_mujoco_task_and_a_gym_task() -> None:
    pytest.importorskip("mujoco")
    from embodied.tasks.mujoco_locomotion import HalfCheetah, HalfCheetahCfg

    check_env(to_gymnasium_env(HalfCheetah(HalfCheetahCfg(), 1, "cpu", seed=0)), skip_render_check=True)
    # the forward adapter, turned around, is a valid gymnasium env again
    pendulum = GymnasiumVecEnv(GymnasiumCfg(env_id="Pendulum-v1"), 1, "cpu", seed=0)
    check_env(to_gymnasium_env(pendulum), skip_render_check=True)


def test_reverse_vector_env_speaks_numpy_with_same_step_autoreset() -> None:
    pytest.importorskip("mujoco")
    from embodied.tasks.mujoco_locomotion import HalfCheetah, HalfCheetahCfg, MujocoTaskBackendCfg

    cfg = HalfCheetahCfg(backend=MujocoTaskBackendCfg(max_episode_steps=2))
    vec = to_gymnasium(HalfCheetah(cfg, 4, "cpu", seed=0))
    assert isinstance(vec, gymnasium.vector.VectorEnv)
    obs, _ = vec.reset(seed=3)
    assert obs.shape == (4, 17) and obs.dtype == np.float32 and vec.observation_space.contains(obs)
    vec.action_space.seed(0)
    vec.step(vec.action_space.sample())
    obs, reward, terminated, truncated, info = vec.step(vec.action_space.sample())
    assert reward.shape == (4,) and truncated.all() and not terminated.any()
    assert info["_final_obs"].all() and np.abs(info["final_obs"] - obs).max() > 0.1
    vec.close()


def test_unknown_env_id_lists_closest_registered_ids() -> None:
    with pytest.raises(ConfigError, match=r"unknown gymnasium env id 'Pendulm-v1'.*closest.*Pendulum-v1"):
        registry.make_env("gym:Pendulm-v1", registry.task_cfg("gym:Pendulm-v1"), 1, "cpu", seed=0)
