"""Offline-to-online (o2o): Cal-QL penalty, Monte-Carlo returns, symmetric sampling, phases."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch

from embodied import registry
from embodied.algo import PreloadSource, Transition
from embodied.algos.o2o import O2O, O2OCfg, calql_penalty
from embodied.cli import main
from embodied.config import ConfigError
from embodied.data.demos import Episode, load_dataset, write_dataset
from embodied.data.offline import OfflineTransitions, mc_returns, symmetric_sample
from embodied.data.replay import ReplayBuffer
from embodied.errors import EmbodiedError
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.training.evaluate import evaluate
from embodied.training.run import load_run


def small_cfg(mode: Literal["rlpd", "wsrl"]) -> O2OCfg:
    """A tiny o2o config: 6 offline steps, 4 per trainer step."""
    return O2OCfg(
        num_critics=2,
        actor_hidden=(32, 32),
        critic_hidden=(32, 32),
        batch_size=16,
        cql_num_actions=2,
        offline_steps=6,
        offline_updates_per_step=4,
        learning_starts=8,
        online_mode=mode,
        wsrl_warmup_steps=4,
    )


def test_calql_penalty_hand_computed() -> None:
    # One critic, one state, one action of each kind, A = 1: the uniform density is 1/2, so the
    # random action enters as Q - log(1/2) = 0 + log 2; policy terms enter as Q - log pi = Q.
    one = torch.ones(1, 1, 1)
    zero = torch.zeros(1, 1, 1)
    q_data = torch.ones(1, 1)
    logp = torch.zeros(1, 1)
    cql = calql_penalty(q_data, zero, zero, logp, zero, logp, action_dim=1)
    assert cql.shape == (1,)
    assert float(cql) == pytest.approx(math.log(2.0 + 1.0 + 1.0) - 1.0, abs=1e-6)
    # Cal-QL raises the two policy Q-values (0) to the Monte-Carlo return 1; the uniform one is untouched.
    calql = calql_penalty(q_data, zero, zero, logp, zero, logp, action_dim=1, mc_return=torch.ones(1))
    assert float(calql) == pytest.approx(math.log(2.0 + 2.0 * math.e) - 1.0, abs=1e-6)
    # a Q-value already above the bound is unchanged; temperature 2 halves then doubles
    calql = calql_penalty(q_data, zero, 3 * one, logp, zero, logp, action_dim=1, mc_return=torch.ones(1))
    assert float(calql) == pytest.approx(math.log(2.0 + math.exp(3.0) + math.e) - 1.0, abs=1e-6)
    hot = calql_penalty(q_data, zero, zero, logp, zero, logp, action_dim=1, temperature=2.0)
    assert float(hot) == pytest.approx(2.0 * math.log(2.0 ** (1 / 2) + 2.0) - 1.0, abs=1e-6)


def test_calql_penalty_pushes_policy_actions_down_not_below_the_return() -> None:
    q_pi = torch.zeros(1, 1, 1, requires_grad=True)
    logp = torch.zeros(1, 1)
    args = (torch.zeros(1, 1), torch.full((1, 1, 1), -50.0), q_pi, logp, torch.full((1, 1, 1), -50.0), logp)
    calql_penalty(*args, action_dim=1).sum().backward()
    assert q_pi.grad is not None and float(q_pi.grad) > 0.5  # CQL: push Q(s, a_pi) down
    q_pi.grad = None
    calql_penalty(*args, action_dim=1, mc_return=torch.ones(1)).sum().backward()
    assert q_pi.grad is not None and float(q_pi.grad) == 0.0  # below the Monte-Carlo return: clipped, no push


def test_mc_returns_hand_computed() -> None:
    # episode 0: success at its third step (terminated); episode 1: cut by the time limit
    rewards = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    episode = np.array([0, 0, 0, 1, 1])
    term = np.array([False, False, True, False, False])
    got = mc_returns(rewards, episode, term, gamma=0.5)
    np.testing.assert_allclose(got, [0.25, 0.5, 1.0, 1.5, 1.0])
    with pytest.raises(ValueError, match="one row per step"):
        mc_returns(rewards, episode[:3], term, gamma=0.5)


def _dataset(tmp_path: Path, obs_dim: int = 18, action_dim: int = 3) -> Path:
    """Two short episodes whose observations count up (row t holds t), one success."""
    episodes = []
    for length, success in ((3, True), (2, False)):
        obs = np.repeat(np.arange(length + 1, dtype=np.float32)[:, None], obs_dim, axis=1)
        term = np.zeros(length, dtype=bool)
        term[-1] = success
        episodes.append(
            Episode(
                observations=obs,
                actions=np.full((length, action_dim), 0.5, dtype=np.float32),
                rewards=term.astype(np.float64),
                terminations=term,
                truncations=~term & (np.arange(length) == length - 1),
            )
        )
    return write_dataset(tmp_path / "demos", episodes, "test/o2o-v0", "test")


def test_offline_transitions_use_each_episodes_successor(tmp_path: Path) -> None:
    demos = load_dataset(_dataset(tmp_path))
    np.testing.assert_array_equal(demos.next_obs[:, 0], [1, 2, 3, 1, 2])  # final obs after each last step
    data = OfflineTransitions(demos, gamma=0.5, device="cpu")
    np.testing.assert_allclose(data.mc_return.numpy(), [0.25, 0.5, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(data.discount.numpy(), [0.5, 0.5, 0.0, 0.5, 0.5])
    batch = data.sample(64)
    assert batch.mc_return is not None and batch.mc_return.shape == (64,)
    assert torch.equal(batch.next_obs["policy"][:, 0], batch.obs["policy"][:, 0] + 1)


def test_symmetric_sampler_splits_half_and_half(tmp_path: Path) -> None:
    offline = OfflineTransitions(load_dataset(_dataset(tmp_path, obs_dim=2, action_dim=1)), 0.99, "cpu")
    online = ReplayBuffer(3, 20, {"policy": (2,)}, 1)
    for _ in range(10):
        obs = torch.full((3, 2), -1.0)  # online rows are marked -1; offline rows are >= 0
        online.add(
            {"policy": obs},
            torch.zeros(3, 1),
            torch.zeros(3),
            torch.zeros(3, dtype=torch.bool),
            torch.zeros(3, dtype=torch.bool),
            {"policy": obs},
        )
    for size in (256, 7):
        batch = symmetric_sample(online, offline, size)
        from_online = batch.obs["policy"][:, 0] < 0
        assert int((~from_online).sum()) == round(size / 2)  # offline share first, then online
        assert bool((~from_online[: round(size / 2)]).all()) and bool(from_online[round(size / 2) :].all())
        assert batch.mc_return is not None  # online rows have no Monte-Carlo return: no bound
        assert bool((batch.mc_return[from_online] == -torch.inf).all())
        assert bool(torch.isfinite(batch.mc_return[~from_online]).all())
    assert bool((symmetric_sample(online, offline, 8, offline_fraction=0.0).obs["policy"] < 0).all())


@pytest.fixture
def env() -> ArmPush:
    torch.set_num_threads(1)
    return ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)


def _step(algo: O2O, env: ArmPush, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    action = algo.act(obs)
    nxt, reward, term, trunc, info = env.step(action)
    algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
    return nxt


@pytest.mark.parametrize("mode", ["rlpd", "wsrl"])
def test_phases_and_resume(env: ArmPush, tmp_path: Path, mode: Literal["rlpd", "wsrl"]) -> None:
    torch.manual_seed(0)
    cfg = small_cfg(mode)
    algo = O2O(cfg, env)
    with pytest.raises(EmbodiedError, match="--dataset"):
        algo.update()
    with pytest.raises(EmbodiedError, match="--dataset PATH"):
        algo.preload(PreloadSource(base_run=tmp_path))
    algo.preload(PreloadSource(dataset=_dataset(tmp_path)))
    norm = algo.policy.obs_norm
    assert norm is not None
    mean = norm.mean.clone()
    obs = env.reset(seed=0)
    metrics = {}
    while algo.phase == "offline":
        obs = _step(algo, env, obs)
        assert algo.ready_to_update() and len(algo.replay) == 0  # offline: env steps are not stored
        metrics = algo.update()
    assert metrics["offline_updates"] == 6.0 and "cql_penalty" in metrics
    assert algo.phase == ("warmup" if mode == "wsrl" else "online")
    assert (algo.offline is None) == (mode == "wsrl")
    while not algo.ready_to_update():
        obs = _step(algo, env, obs)
    assert algo.phase == "online"
    metrics = algo.update()
    assert metrics["phase"] == 2.0 and "cql_penalty" not in metrics
    assert torch.equal(norm.mean, mean)  # statistics stay the dataset's

    again = O2O(cfg, env)
    again.preload(PreloadSource(dataset=_dataset(tmp_path / "again")))
    again.load_state_dict(algo.state_dict())
    assert again.phase == "online" and again.offline_updates == 6
    assert (again.offline is None) == (mode == "wsrl")


def test_refuses_a_privileged_critic_group(tmp_path: Path) -> None:
    env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 2, "cpu", seed=0)
    algo = O2O(small_cfg("rlpd"), env)
    with pytest.raises(EmbodiedError, match="privileged 'critic'"):
        algo.preload(PreloadSource(dataset=_dataset(tmp_path)))


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"algo\.online_mode"):
        O2OCfg(online_mode="nope")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"algo\.n_step"):
        O2OCfg(n_step=3)
    with pytest.raises(ConfigError, match=r"algo\.num_atoms"):
        O2OCfg(num_atoms=51)


def test_cli_train_resume_export(tmp_path: Path) -> None:
    """Through the shared trainer: offline then online, resume across the phase, ONNX export."""
    demos = tmp_path / "demos"
    assert main(["collect", "scripted:arm-push", "--episodes", "4", "--num-envs", "2", "--out", str(demos)]) == 0
    run = tmp_path / "run"
    tiny = ["algo.num_critics=2", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.batch_size=8"]
    tiny += ["algo.cql_num_actions=2", "algo.offline_steps=4", "algo.offline_updates_per_step=2"]
    tiny += ["algo.learning_starts=2", "trainer.eval_episodes=2", "trainer.torch_threads=1"]
    argv = ["train", "arm-push", "--algo", "o2o", "--dataset", str(demos), "--run-dir", str(run), "--num-envs", "2"]
    assert main([*argv, "--no-progress", *tiny, "trainer.total_env_steps=4"]) == 0
    assert load_run(run).algo.phase == "online"  # 2 trainer steps x 2 offline steps: offline done
    assert main(["train", "--resume", str(run), "--no-progress", "trainer.total_env_steps=10"]) == 0
    loaded = load_run(run)
    assert loaded.algo.phase == "online" and loaded.algo.offline_updates == 4 and loaded.algo.env_steps == 6
    assert main(["export", str(run), "--format", "onnx", "--no-record"]) == 0


@pytest.mark.slow
def test_offline_phase_learns_from_expert_demos(tmp_path: Path) -> None:
    """1,500 Cal-QL steps on 60 expert episodes: the deterministic actor pushes blocks home in at
    least 10 % of 40 episodes; the untrained actor (and uniform random actions, 0.5 %) do not."""
    demos = tmp_path / "expert"
    assert main(["collect", "scripted:arm-push", "--episodes", "60", "--seed", "5", "--out", str(demos)]) == 0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)
    cfg = O2OCfg(
        num_critics=2,
        actor_hidden=(64, 64),
        critic_hidden=(64, 64),
        batch_size=128,
        cql_num_actions=2,
        actor_lr=3e-4,
        offline_steps=1500,
        offline_updates_per_step=500,
    )
    algo = O2O(cfg, env)
    algo.preload(PreloadSource(dataset=demos))

    def success() -> float:
        return evaluate(
            lambda _env: lambda obs: algo.policy.act(obs, deterministic=True),
            lambda n, seed: ArmPush(ArmPushCfg(), num_envs=n, device="cpu", seed=seed),
            episodes=40,
            seed=123,
        ).success_rate

    assert success() == 0.0
    while algo.phase == "offline":
        algo.update()
    assert success() >= 0.10
