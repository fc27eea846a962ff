"""The batched MuJoCo backend against gymnasium's own v5 envs, plus auto-reset, determinism and
per-env randomization."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gymnasium = pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from embodied import registry  # noqa: E402
from embodied.env import VecEnv  # noqa: E402
from embodied.sim.mujoco import MujocoRandomizationCfg  # noqa: E402
from embodied.tasks.mujoco_locomotion import (  # noqa: E402
    Ant,
    AntCfg,
    HalfCheetah,
    HalfCheetahCfg,
    Humanoid,
    HumanoidCfg,
    MujocoTaskBackendCfg,
)

CASES = [
    (HalfCheetah, HalfCheetahCfg, "HalfCheetah-v5"),
    (Ant, AntCfg, "Ant-v5"),
    (Humanoid, HumanoidCfg, "Humanoid-v5"),
]
# our reward term name -> gymnasium's info key
GYM_TERMS = {
    "forward": "reward_forward",
    "ctrl": "reward_ctrl",
    "contact": "reward_contact",
    "survive": "reward_survive",
}


@pytest.mark.parametrize(("cls", "cfg_cls", "gym_id"), CASES, ids=[c[2] for c in CASES])
def test_matches_gymnasium_on_identical_states(cls: type, cfg_cls: type, gym_id: str) -> None:
    env = cls(cfg_cls(), num_envs=3, device="cpu", seed=0)
    ref = gymnasium.make(gym_id).unwrapped
    ref.reset(seed=0)
    row = 1  # a middle row: catches off-by-one-env indexing
    ref.set_state(env.qpos[row].copy(), env.qvel[row].copy())
    obs0 = env.reset(seed=None)  # a fresh draw: the reference follows it again
    ref.set_state(env.qpos[row].copy(), env.qvel[row].copy())
    np.testing.assert_allclose(obs0["policy"][row].numpy(), ref._get_obs(), rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(40):
        action = rng.uniform(-1, 1, (3, env.action_dim))
        ref_obs, ref_reward, ref_term, _, ref_info = ref.step((env.ctrl_mid + env.ctrl_half * action)[row])
        _, reward, terminated, _, info = env.step(torch.as_tensor(action))
        assert bool(terminated[row]) == ref_term
        final = info["final_obs"]["policy"][row].numpy()
        np.testing.assert_allclose(final, ref_obs.astype(np.float32), rtol=1e-5, atol=1e-5)
        assert reward[row].item() == pytest.approx(ref_reward, rel=1e-5, abs=1e-5)
        for name, value in info["reward_terms"].items():
            assert value[row].item() == pytest.approx(ref_info[GYM_TERMS[name]], rel=1e-5, abs=1e-5)
        checked += 1
        if ref_term:
            break
    assert checked >= 10


def test_auto_reset_on_time_limit_keeps_final_obs() -> None:
    cfg = HalfCheetahCfg(backend=MujocoTaskBackendCfg(max_episode_steps=3))
    env = HalfCheetah(cfg, num_envs=4, device="cpu", seed=0)
    action = torch.full((4, env.action_dim), 0.7)
    for step in range(3):
        obs, _, terminated, truncated, info = env.step(action)
        assert not terminated.any()
        assert bool(truncated.all()) == (step == 2)
    final = info["final_obs"]["policy"]
    # the returned obs is a fresh reset draw (joint angles within the noise), the final one is not
    qpos0 = torch.as_tensor(env.model.qpos0[1:], dtype=torch.float32)
    assert (obs["policy"][:, :8] - qpos0).abs().max() <= cfg.reset_noise_scale + 1e-6
    assert (final - obs["policy"]).abs().max() > 0.1
    assert (env.episode_step == 0).all()
    obs, _, _, truncated, info = env.step(action)
    assert not truncated.any()
    assert torch.equal(info["final_obs"]["policy"], obs["policy"])  # nobody ended


def test_ant_terminates_only_the_unhealthy_env() -> None:
    env = Ant(AntCfg(), num_envs=3, device="cpu", seed=0)
    qpos, qvel = env.qpos.copy(), env.qvel.copy()
    qpos[0, 2] = 1.5  # torso above the healthy range (0.2, 1.0)
    env.set_state(qpos, qvel)
    obs, _, terminated, truncated, info = env.step(torch.zeros(3, env.action_dim))
    assert terminated.tolist() == [True, False, False]
    assert not truncated.any()
    assert info["final_obs"]["policy"][0, 0] > 1.0  # z of the episode's end
    assert abs(obs["policy"][0, 0] - 0.75) <= 0.1 + 1e-6  # z of the new episode (0.75 +- noise)
    assert torch.equal(info["final_obs"]["policy"][1:], obs["policy"][1:])
    assert info["reward_terms"]["survive"].tolist() == [0.0, 1.0, 1.0]
    assert not info["success"].any()


def test_same_seed_same_trajectory_and_state_dict_resumes_exactly() -> None:
    actions = torch.rand((12, 4, 8), generator=torch.Generator().manual_seed(0)) * 2 - 1
    a = Ant(AntCfg(), num_envs=4, device="cpu", seed=7)
    b = Ant(AntCfg(), num_envs=4, device="cpu", seed=7)
    for act in actions[:6]:
        out_a, out_b = a.step(act), b.step(act)
        assert torch.equal(out_a[0]["policy"], out_b[0]["policy"])
        assert torch.equal(out_a[1], out_b[1])
    saved = a.state_dict()
    c = Ant(AntCfg(), num_envs=4, device="cpu", seed=123)  # different seed: state must come from `saved`
    c.load_state_dict(saved)
    for act in actions[6:]:
        out_a, out_c = a.step(act), c.step(act)
        assert torch.equal(out_a[0]["policy"], out_c[0]["policy"])
        assert torch.equal(out_a[1], out_c[1])
    other = Ant(AntCfg(), num_envs=4, device="cpu", seed=8)
    assert not torch.equal(other.reset()["policy"], Ant(AntCfg(), 4, "cpu", seed=7).reset()["policy"])


def test_randomization_changes_parameters_only_when_enabled() -> None:
    off = Ant(AntCfg(), num_envs=3, device="cpu", seed=0)
    assert off.physics._expanded == {}  # nominal model shared by every env
    np.testing.assert_array_equal(off.body_masses(), np.broadcast_to(off.model.body_mass, (3, off.model.nbody)))

    rand = MujocoRandomizationCfg(enabled=True, body_mass_scale=(0.5, 1.5), friction_scale=(0.5, 1.5))
    on = Ant(AntCfg(backend=MujocoTaskBackendCfg(randomization=rand)), num_envs=3, device="cpu", seed=0)
    masses = on.body_masses()
    ratio = masses[:, 1:] / on.model.body_mass[1:]
    assert ((ratio >= 0.5) & (ratio <= 1.5)).all()
    assert np.ptp(ratio[:, 0]) > 1e-3  # envs differ from each other
    friction = on.physics.expand("geom_friction")[:, :, 0]
    assert np.ptp(friction[:, 0]) > 1e-3

    # the parameters reach the physics: identical states and actions diverge only with randomization
    for env in (off, on):
        qpos = np.repeat(env.model.qpos0[None], 3, axis=0)
        env.set_state(qpos, np.zeros((3, env.model.nv)))
        for _ in range(5):
            obs = env.step(torch.full((3, 8), 0.5))[0]["policy"]
        spread = (obs - obs[0]).abs().max().item()
        assert (spread > 1e-4) if env is on else (spread == 0.0)


def test_registered_tasks_build_through_the_registry() -> None:
    for name, gym_id in [
        ("mujoco-halfcheetah", "HalfCheetah-v5"),
        ("mujoco-ant", "Ant-v5"),
        ("mujoco-humanoid", "Humanoid-v5"),
    ]:
        env = registry.make_env(name, registry.task_cfg(name), num_envs=2, device="cpu", seed=0)
        assert isinstance(env, VecEnv)
        spec = env.io_spec()
        ref = gymnasium.make(gym_id)
        assert env.obs_spec["policy"] == ref.observation_space.shape == (spec.obs_dim,)
        assert env.action_dim == spec.action_dim == ref.action_space.shape[0]
        assert env.dt == pytest.approx(ref.unwrapped.dt)
        assert env.max_episode_steps == ref.spec.max_episode_steps
        env.close()
