"""o2o-residual: Cal-QL pretraining of a residual on a frozen pretrained policy, then online
residual RL. Phases and resume, the penalty's policy density, the Monte-Carlo returns its bound
reads, a correction learned offline alone, and the command line on a bc-flow base."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flow_deploy_support import fly_arm_push
from test_residual import SMALL, BiasedReach, OffsetBase, flow_base, success_rate

from embodied.algo import PreloadSource, Transition
from embodied.algos.o2o import O2O, O2OCfg
from embodied.algos.residual_o2o import ResidualO2O, ResidualO2OCfg
from embodied.cli import main
from embodied.config import ConfigError
from embodied.data.demos import Episode, write_dataset
from embodied.data.offline import mc_returns
from embodied.errors import EmbodiedError
from embodied.real.runner import PolicyRunner
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.training.run import load_run


def _random_dataset(path: Path) -> tuple[Path, np.ndarray]:
    """Two arm-push-shaped episodes with rewards; returns the path and every step's MC return."""
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            observations=rng.normal(size=(n + 1, 18)).astype(np.float32),
            actions=rng.uniform(-1, 1, size=(n, 3)).astype(np.float32),
            rewards=rng.uniform(0, 1, size=n),
            terminations=np.arange(n) == n - 1,
            truncations=np.zeros(n, dtype=bool),
        )
        for n in (5, 7)
    ]
    rewards = np.concatenate([e.rewards for e in episodes])
    index = np.repeat([0, 1], [5, 7])
    ends = np.concatenate([e.terminations for e in episodes])
    return write_dataset(path, episodes, "test/demos-v0", "random"), mc_returns(rewards, index, ends, 0.99)


def _cfg(**kw: Any) -> ResidualO2OCfg:
    tiny = {"batch_size": 16, "cql_num_actions": 2, "offline_steps": 6, "offline_updates_per_step": 4}
    return ResidualO2OCfg(**(SMALL | tiny | {"learning_starts": 8, "n_step": 1} | kw))


def test_phases_returns_and_resume(tmp_path: Path) -> None:
    torch.manual_seed(0)
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    algo = ResidualO2O(_cfg(), env)
    with pytest.raises(EmbodiedError, match="--base RUN_DIR"):
        algo.preload(PreloadSource(dataset=tmp_path))
    algo.preload(PreloadSource(base_policy=flow_base(1)))
    with pytest.raises(EmbodiedError, match="--dataset PATH"):
        algo.update()  # a run rebuilt without its dataset cannot pretrain

    algo = ResidualO2O(_cfg(), env)
    path, returns = _random_dataset(tmp_path / "demos")
    algo.preload(PreloadSource(base_policy=flow_base(1), dataset=path))
    batch = algo.sample_batch()
    assert batch.mc_return is not None and "mc_return" not in batch.obs
    # every row's bound is its own step's discounted return-to-go
    for action, bound in zip(batch.action, batch.mc_return, strict=True):
        row = int((algo.demos.action[:, 0] == action).all(dim=1).nonzero()[0, 0])  # type: ignore[union-attr]
        assert float(bound) == pytest.approx(returns[row], rel=1e-6)

    obs = env.reset(seed=0)
    metrics: dict[str, float] = {}
    while algo.phase == "offline":
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
        obs = nxt
        assert algo.ready_to_update() and len(algo.replay) == 0  # offline: env steps are not stored
        metrics = algo.update()
    assert metrics["offline_updates"] == 6.0 and metrics["cql_penalty"] != 0.0 and "actor_loss" in metrics
    assert not algo.ready_to_update()  # the warm start: learning_starts steps are collected first
    while not algo.ready_to_update():
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
        obs = nxt
    metrics = algo.update()
    assert metrics["phase"] == 2.0 and "cql_penalty" not in metrics

    again = ResidualO2O(_cfg(), env)
    again.preload(PreloadSource(base_policy=flow_base(1), dataset=path))
    again.load_state_dict(algo.state_dict())
    assert again.phase == "online" and again.offline_updates == 6
    torch.testing.assert_close(
        again.policy.combine(obs["policy"], obs["policy"][:, :3]),
        algo.policy.combine(obs["policy"], obs["policy"][:, :3]),
    )


def _run_until(algo: ResidualO2O, env: ArmPush, obs: dict[str, torch.Tensor], done: Any) -> dict[str, torch.Tensor]:
    """Step ``env`` with ``algo`` (updating whenever it is ready) until ``done()``; the last obs."""
    while not done():
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
        obs = nxt
        if algo.ready_to_update() and not done():
            algo.update()
    return obs


def test_online_critic_warmup_keeps_the_offline_residual(tmp_path: Path) -> None:
    torch.manual_seed(0)
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    algo = ResidualO2O(_cfg(online_critic_warmup_updates=3, updates_per_step=1), env)
    path, _ = _random_dataset(tmp_path / "demos")
    algo.preload(PreloadSource(base_policy=flow_base(1), dataset=path))
    obs = _run_until(algo, env, env.reset(seed=0), lambda: algo.phase == "online")
    assert algo.online_start_update == algo.num_updates == 6
    obs = _run_until(algo, env, obs, algo.ready_to_update)
    offline_residual = [p.detach().clone() for p in algo.actor_parameters()]
    critic_before = [p.detach().clone() for p in algo.critic.parameters()]
    for _ in range(3):  # the warm-up: the critic moves, the residual does not
        assert "actor_loss" not in algo.update()
    assert all(torch.equal(a, b) for a, b in zip(offline_residual, algo.actor_parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(critic_before, algo.critic.parameters(), strict=True))
    restored = ResidualO2O(_cfg(online_critic_warmup_updates=3, updates_per_step=1), env)
    restored.preload(PreloadSource(base_policy=flow_base(1), dataset=path))
    restored.load_state_dict(algo.state_dict())
    assert restored.online_start_update == 6
    metrics = algo.update()  # the fourth online step also trains the residual
    assert "actor_loss" in metrics
    assert not all(torch.equal(a, b) for a, b in zip(offline_residual, algo.actor_parameters(), strict=True))
    with pytest.raises(ConfigError, match="online_critic_warmup_updates must be >= 0"):
        _cfg(online_critic_warmup_updates=-1)


def test_offline_actor_off_starts_online_from_the_base_itself(tmp_path: Path) -> None:
    """``offline_actor=false``: the offline phase fits the critic, the residual stays at zero."""
    torch.manual_seed(0)
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    algo = ResidualO2O(_cfg(offline_actor=False, updates_per_step=1), env)
    path, _ = _random_dataset(tmp_path / "demos")
    algo.preload(PreloadSource(base_policy=flow_base(1), dataset=path))
    residual_before = [p.detach().clone() for p in algo.actor_parameters()]
    critic_before = [p.detach().clone() for p in algo.critic.parameters()]
    obs = _run_until(algo, env, env.reset(seed=0), lambda: algo.phase == "online")
    assert all(torch.equal(a, b) for a, b in zip(residual_before, algo.actor_parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(critic_before, algo.critic.parameters(), strict=True))
    base_action = obs["policy"][:, :3].clamp(-1.0, 1.0)
    torch.testing.assert_close(algo.policy.combine(obs["policy"], base_action), base_action)
    obs = _run_until(algo, env, obs, algo.ready_to_update)
    assert any("actor_loss" in algo.update() for _ in range(2))  # online (policy delay 2), the residual trains


def test_penalty_policy_actions_carry_their_exact_gaussian_density() -> None:
    torch.manual_seed(0)
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    algo = ResidualO2O(_cfg(cql_policy_std=0.3, cql_num_actions=5), env)
    algo.preload(PreloadSource(base_policy=flow_base(1)))
    actor_obs = torch.cat([torch.randn(4, 18), torch.rand(4, 3) * 1.4 - 0.7], dim=-1)
    actions, logp = algo._noisy_policy_actions(actor_obs)
    mean = algo.policy(actor_obs).repeat_interleave(5, 0)
    inside = (actions.abs() < 1.0).all(dim=1)  # clipped draws have no density to compare
    want = torch.distributions.Normal(mean, 0.3).log_prob(actions).sum(-1).reshape(4, 5)
    assert inside.sum() >= 10
    torch.testing.assert_close(logp.reshape(-1)[inside], want.reshape(-1)[inside], rtol=1e-5, atol=1e-5)
    assert logp.shape == (4, 5) and float(logp.max()) <= 3 * (-math.log(0.3) - 0.5 * math.log(2 * math.pi)) + 1e-6


def test_o2o_points_a_base_policy_to_o2o_residual_and_config_is_checked(tmp_path: Path) -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    algo = O2O(O2OCfg(num_critics=2, actor_hidden=(16,), critic_hidden=(16,)), env)
    with pytest.raises(EmbodiedError, match="--algo o2o-residual --base RUN_DIR --dataset PATH"):
        algo.preload(PreloadSource(base_policy=flow_base(1), dataset=tmp_path))
    with pytest.raises(ConfigError, match=r"algo\.cql_policy_std"):
        ResidualO2OCfg(cql_policy_std=0.0)
    with pytest.raises(ConfigError, match=r"algo\.num_atoms"):
        ResidualO2OCfg(num_atoms=51)


def test_offline_pretraining_alone_learns_the_correction_the_demos_show(tmp_path: Path) -> None:
    """BiasedReach: the base always misses by 0.3; demonstrations hit the goal (reward 1). After
    the offline phase only (no env step stored, no online update) the residual corrects the base."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    goals = rng.uniform(-0.6, 0.6, size=(256, 1)).astype(np.float32)
    episodes = [
        Episode(
            observations=np.stack([g, g]),
            actions=(g + rng.normal(0, 0.02, size=1)).astype(np.float32)[None],
            rewards=np.ones(1),
            terminations=np.ones(1, dtype=bool),
            truncations=np.zeros(1, dtype=bool),
        )
        for g in goals
    ]
    path = write_dataset(tmp_path / "demos", episodes, "test/reach-v0", "expert")
    env = BiasedReach(32, seed=0)
    base = OffsetBase()
    assert success_rate(base) == 0.0
    algo = ResidualO2O(
        _cfg(
            residual_scale=0.5,
            batch_size=128,
            offline_steps=600,
            offline_updates_per_step=600,
            actor_lr=1e-3,
            critic_lr=1e-3,
            cql_num_actions=4,
        ),
        env,
    )
    algo.preload(PreloadSource(base_policy=base, dataset=path))
    assert success_rate(algo.policy) == 0.0  # starts at the base
    algo.update()
    assert algo.phase == "online" and len(algo.replay) == 0
    assert success_rate(algo.policy) >= 0.8


def test_cli_on_a_bc_flow_base_train_resume_export(tmp_path: Path) -> None:
    demos = tmp_path / "demos"
    assert main(["collect", "scripted:arm-push", "--episodes", "4", "--num-envs", "2", "--out", str(demos)]) == 0
    base = tmp_path / "bc"
    quick = ["trainer.eval_episodes=2", "trainer.torch_threads=1", "--no-progress", "--num-envs", "2"]
    flow = ["algo.policy.hidden=[32,32]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
    flow += ["algo.policy.exec_steps=1", "algo.policy.temporal_ensemble=false"]
    argv = ["train", "arm-push", "--algo", "bc-flow", "--dataset", str(demos), "--run-dir", str(base)]
    assert main([*argv, *flow, *quick, "trainer.total_env_steps=8"]) == 0
    run = tmp_path / "o2o_res"
    tiny = ["algo.num_critics=2", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.batch_size=8"]
    tiny += ["algo.cql_num_actions=2", "algo.offline_steps=4", "algo.offline_updates_per_step=2"]
    tiny += ["algo.learning_starts=2", "algo.updates_per_step=1"]
    argv = ["train", "arm-push", "--algo", "o2o-residual", "--base", str(base), "--dataset", str(demos)]
    assert main([*argv, "--run-dir", str(run), *tiny, *quick, "trainer.total_env_steps=4"]) == 0
    assert load_run(run).algo.phase == "online"  # 2 trainer steps x 2 offline steps
    assert main(["train", "--resume", str(run), "--no-progress", "trainer.total_env_steps=12"]) == 0
    loaded = load_run(run)  # the base comes from trainer.base_run again
    # as in o2o, the learner counts the steps it stored: 12 less the 4 of the offline phase
    assert loaded.algo.phase == "online" and loaded.algo.offline_updates == 4 and loaded.algo.env_steps == 8
    obs = torch.randn(5, 18)
    torch.testing.assert_close(loaded.policy.export_module()(obs), loaded.policy.act(obs), rtol=0, atol=1e-6)

    # fine-tuned -> exported -> deployed: one ONNX graph of base and residual, run by the node
    assert main(["export", str(run), "--format", "c", "--no-record"]) == 2
    assert main(["export", str(run), "--format", "onnx"]) == 0
    runner = PolicyRunner(run)
    for row in obs:
        got = runner(row.numpy())
        np.testing.assert_allclose(got, loaded.policy.act(row[None])[0].numpy(), rtol=0, atol=1e-5)
    flown = fly_arm_push(run / "export", episodes=1, seed=3)
    assert flown.steps >= 10 and flown.rejections == 0 and flown.max_action_diff <= 1e-4
    assert main(["list"]) == 0
