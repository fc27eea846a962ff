"""Residual RL: the combined policy starts exactly at the base, exports base and residual
together, and learns a correction the base cannot make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from env_support import StatelessEnvMixin

from embodied.action_chunks import ChunkExecutor
from embodied.algo import ExportUnsupportedError, PreloadSource, Transition
from embodied.algos.residual import BASE_GROUP, Residual, ResidualCfg
from embodied.config import ConfigError
from embodied.data.demos import Episode, write_dataset
from embodied.env import ObsDict, StepResult
from embodied.errors import EmbodiedError
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.policies.deterministic import DeterministicActor
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg
from embodied.policies.residual import base_chunk_spec
from embodied.tasks.arm_push import ArmPush, ArmPushCfg

SMALL: dict[str, Any] = {
    "actor_hidden": (32, 32),
    "critic_hidden": (32, 32),
    "num_critics": 4,
    "buffer_size_per_env": 500,
}


@pytest.fixture
def env() -> ArmPush:
    torch.set_num_threads(1)
    return ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)


def mlp_base() -> DeterministicActor:
    torch.manual_seed(1)
    base = DeterministicActor(18, 3, hidden=(16,), out_init_std=1.0)
    assert base.obs_norm is not None
    base.obs_norm.update(torch.randn(64, 18) * 0.3)
    return base


def flow_base(exec_steps: int, temporal_ensemble: bool = False) -> FlowPolicy:
    torch.manual_seed(2)
    cfg = FlowPolicyCfg(
        hidden=(16, 16), chunk=4, exec_steps=exec_steps, denoise_steps=2, temporal_ensemble=temporal_ensemble
    )
    base = FlowPolicy(18, 3, cfg)
    base.set_obs_stats(torch.zeros(18), torch.full((18,), 0.3))
    return base


def residual(env: Any, base: Any, dataset: Path | None = None, **kw: Any) -> Residual:
    algo = Residual(ResidualCfg(**(SMALL | kw)), env)
    algo.preload(PreloadSource(base_policy=base, dataset=dataset))
    return algo


@pytest.mark.parametrize("make_base", [mlp_base, lambda: flow_base(1), lambda: flow_base(3)])
def test_starts_exactly_at_the_base(env: ArmPush, make_base: Any) -> None:
    base = make_base()
    reference = make_base()  # same weights, its own chunk plan
    algo = residual(env, base, residual_scale=0.5)
    obs = env.reset(seed=3)
    for _ in range(5):  # several steps: a chunked base runs its plan open-loop in both
        want = reference.act(obs, deterministic=True)
        got = algo.policy.act(obs, deterministic=True)
        assert torch.equal(got, want)
        obs = env.step(got)[0]
    # the learner's view of the same thing: [obs_n, base action] -> base action
    base_action = torch.rand(7, 3) * 2 - 1
    x = torch.cat([algo.policy.normalize(torch.randn(7, 18)), base_action], dim=-1)
    assert torch.equal(algo.policy(x), base_action)


def test_residual_is_bounded_by_its_scale(env: ArmPush) -> None:
    algo = residual(env, mlp_base(), residual_scale=0.1)
    with torch.no_grad():
        for p in algo.policy.net.parameters():
            p.normal_(0.0, 3.0)  # a saturated residual
    base_action = torch.zeros(50, 3)
    x = torch.cat([torch.randn(50, 18), base_action], dim=-1)
    with torch.no_grad():
        out = algo.policy(x)
    assert float(out.abs().max()) <= 0.1 + 1e-6 and float(out.abs().max()) > 0.05


def test_export_carries_base_and_residual(env: ArmPush, tmp_path: Path) -> None:
    algo = residual(env, mlp_base())
    with torch.no_grad():
        for p in algo.policy.net.parameters():
            p.normal_(0.0, 0.5)
    algo.policy.obs_norm.update(torch.randn(100, 18))  # type: ignore[union-attr]
    obs = torch.randn(9, 18)
    exported = algo.policy.export_module()
    torch.testing.assert_close(exported(obs), algo.policy.act(obs), rtol=0, atol=1e-6)
    assert not torch.equal(exported(obs), algo.policy.base.act(obs, deterministic=True))
    onnx_traced = pytest.importorskip("embodied.export.onnx_traced")
    pytest.importorskip("onnxruntime")
    result = onnx_traced.export_traced_onnx(exported, 18, tmp_path, obs.numpy())
    assert result.max_abs_err <= 1e-5


def test_a_stateful_base_exports_as_planner_and_residual_step(env: ArmPush) -> None:
    with pytest.raises(ExportUnsupportedError, match=r"open-loop.*two graphs"):
        residual(env, flow_base(2)).policy.export_module()
    with pytest.raises(ExportUnsupportedError, match=r"temporal_ensemble.*two graphs"):
        residual(env, flow_base(1, temporal_ensemble=True)).policy.export_module()
    exported = residual(env, flow_base(1)).policy.export_module()
    obs = torch.randn(2, 18)
    assert exported(obs).shape == (2, 3)
    # zero-initialized residual: the export is the first action of the base's fresh plan
    torch.testing.assert_close(exported(obs), flow_base(1).export_module()(obs)[:, 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize(("exec_steps", "ensemble"), [(1, False), (3, False), (1, True)])
def test_planner_and_step_rebuild_act_for_every_chunk_execution(env: ArmPush, exec_steps: int, ensemble: bool) -> None:
    algo = residual(env, flow_base(exec_steps, temporal_ensemble=ensemble))
    with torch.no_grad():
        for p in algo.policy.net.parameters():
            p.normal_(0.0, 0.5)  # a residual that moves the base
    algo.policy.obs_norm.update(torch.randn(100, 18))  # type: ignore[union-attr]
    planner, step = algo.policy.base_planner(), algo.policy.step_module()
    executor: ChunkExecutor[torch.Tensor] = ChunkExecutor(planner, base_chunk_spec(algo.policy.base))
    obs = env.reset(seed=5)
    moved = False
    for _ in range(7):  # past two plans of the open-loop base, several blends of the ensemble
        want = algo.policy.act(obs)
        with torch.no_grad():
            base_action = executor(obs["policy"])
            got = step(obs["policy"], base_action)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        moved = moved or not torch.equal(got, base_action)
        obs = env.step(want)[0]
    assert moved


def test_needs_a_base_and_fitting_sizes(env: ArmPush) -> None:
    algo = Residual(ResidualCfg(**SMALL), env)
    with pytest.raises(EmbodiedError, match="--base RUN_DIR"):
        algo.preload(PreloadSource(dataset=Path("demos")))
    with pytest.raises(EmbodiedError, match="--base"):
        algo.act(env.reset(seed=0))
    wrong = DeterministicActor(18, 2, hidden=(8,))
    with pytest.raises(EmbodiedError, match="needs 3"):
        algo.preload(PreloadSource(base_policy=wrong))
    with pytest.raises(ConfigError, match="residual_scale"):
        ResidualCfg(residual_scale=0.0)
    with pytest.raises(ConfigError, match="random_steps"):
        ResidualCfg(random_steps=100)


def test_replay_keeps_the_base_actions_and_demos_fill_half_a_batch(env: ArmPush, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            observations=rng.normal(size=(n + 1, 18)).astype(np.float32),
            actions=rng.uniform(-1, 1, size=(n, 3)).astype(np.float32),
            rewards=np.zeros(n),
            terminations=np.arange(n) == n - 1,
            truncations=np.zeros(n, dtype=bool),
        )
        for n in (5, 7)
    ]
    path = write_dataset(tmp_path / "demos", episodes, "test/demos-v0", "random")
    base = flow_base(2)
    algo = residual(env, base, dataset=path, batch_size=10, demo_fraction=0.5)
    assert algo.demos is not None and len(algo.demos) == 12
    obs = env.reset(seed=0)
    reference = flow_base(2)
    for _ in range(3):
        want = reference.act(obs, deterministic=True)
        action = algo.act(obs)
        next_obs, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, next_obs, info["final_obs"]))
        row = (algo.replay.cursor - 1) % algo.replay.capacity
        assert torch.equal(algo.replay.obs[BASE_GROUP][row], want)
        obs = next_obs
    batch = algo.sample_batch()
    assert batch.action.shape == (10, 3)
    demo_actions = torch.as_tensor(np.concatenate([e.actions for e in episodes]))
    from_demos = [bool((demo_actions == a).all(dim=1).any()) for a in batch.action]
    assert from_demos == [False] * 5 + [True] * 5


class BiasedReach(StatelessEnvMixin):
    """A one-step contextual task: observe a goal ``g`` in [-0.6, 0.6], succeed (reward 1) when
    the action lands within 0.1 of it. A stand-in for a real task so that learning shows in
    seconds; the base below always misses by 0.3, which only a learned correction fixes."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.obs_spec = {"policy": (1,)}
        self.action_dim = 1
        self.dt = 0.1
        self.max_episode_steps = 1
        self.gen = torch.Generator().manual_seed(seed)
        self.goal = torch.zeros(num_envs, 1)

    def _draw(self) -> ObsDict:
        self.goal = (torch.rand(self.num_envs, 1, generator=self.gen) * 2 - 1) * 0.6
        return {"policy": self.goal.clone()}

    def reset(self, seed: int | None = None) -> ObsDict:
        if seed is not None:
            self.gen.manual_seed(seed)
        return self._draw()

    def step(self, action: torch.Tensor) -> StepResult:
        success = (action - self.goal).abs()[:, 0] < 0.1
        final = {"policy": self.goal.clone()}
        done = torch.ones(self.num_envs, dtype=torch.bool)
        info: dict[str, Any] = {"final_obs": final, "reward_terms": {}, "success": success}
        return self._draw(), success.float(), done, torch.zeros_like(done), info

    def io_spec(self) -> IOSpec:
        return IOSpec((ObsField("goal", 1),), (ActionField("position", 1, "m"),), self.dt)


class OffsetBase(torch.nn.Module):
    """``a = clip(g + 0.3, -1, 1)``: right idea, always 0.3 too far."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs + 0.3).clamp(-1.0, 1.0)

    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self(obs["policy"] if isinstance(obs, dict) else obs)

    def export_module(self) -> torch.nn.Module:
        return OffsetBase()


def success_rate(policy: Any, seed: int = 99) -> float:
    env = BiasedReach(512, seed=seed)
    obs = env.reset(seed=seed)
    return float(env.step(policy.act(obs, deterministic=True))[4]["success"].float().mean())


def test_residual_fixes_what_the_base_cannot() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    env = BiasedReach(32, seed=0)
    base = OffsetBase()
    assert success_rate(base) == 0.0
    algo = residual(
        env,
        base,
        residual_scale=0.5,
        n_step=1,
        learning_starts=256,
        critic_warmup_updates=50,
        updates_per_step=2,
        batch_size=128,
        actor_lr=1e-3,
        critic_lr=1e-3,
        std_min=0.1,
        std_max=0.3,
    )
    assert success_rate(algo.policy) == 0.0  # starts at the base
    obs = env.reset(seed=0)
    for _ in range(300):
        action = algo.act(obs)
        next_obs, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, next_obs, info["final_obs"]))
        obs = next_obs
        if algo.ready_to_update():
            algo.update()
    assert success_rate(algo.policy) >= 0.8
