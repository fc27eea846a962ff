"""FastTD3 and SAC learn a small continuous-control task within seconds on a CPU.

The task is a batched torch copy of gymnasium's Pendulum-v1 (same dynamics, reward, limits
and 200-step time limit), written here so the test runs without the gymnasium adapter and
exercises truncation bootstrapping through ``info["final_obs"]``. A random or zero policy
scores about -1200 per episode; the thresholds below need a policy that swings up and holds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from env_support import StatelessEnvMixin

from embodied.algo import Transition
from embodied.algos.fasttd3 import FastTD3, FastTD3Cfg
from embodied.algos.sac import SAC, SACCfg
from embodied.env import ObsDict, StepResult
from embodied.errors import EmbodiedError
from embodied.io_spec import ActionField, IOSpec, ObsField


class TorchPendulum(StatelessEnvMixin):
    """``num_envs`` Pendulum-v1 copies: obs ``[cos th, sin th, th_dot]``, action ``[N, 1]`` -> torque 2a."""

    max_speed, max_torque, dt, g, mass, length = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def __init__(self, num_envs: int, seed: int = 0, max_episode_steps: int = 200, critic: bool = False) -> None:
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.obs_spec: dict[str, tuple[int, ...]] = {"policy": (3,)}
        if critic:  # privileged group: the angle itself and the time left in the episode
            self.obs_spec["critic"] = (2,)
        self.action_dim = 1
        self.max_episode_steps = max_episode_steps
        self.gen = torch.Generator().manual_seed(seed)
        self.th = torch.zeros(num_envs)
        self.th_dot = torch.zeros(num_envs)
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _obs(self) -> ObsDict:
        obs = {"policy": torch.stack([self.th.cos(), self.th.sin(), self.th_dot], dim=1)}
        if "critic" in self.obs_spec:
            time_left = (self.max_episode_steps - self.t).float() / self.max_episode_steps
            obs["critic"] = torch.stack([self.th, time_left], dim=1)
        return obs

    def _reset_rows(self, rows: torch.Tensor) -> None:
        n = int(rows.sum())
        self.th[rows] = (torch.rand(n, generator=self.gen) * 2 - 1) * math.pi
        self.th_dot[rows] = torch.rand(n, generator=self.gen) * 2 - 1
        self.t[rows] = 0

    def reset(self, seed: int | None = None) -> ObsDict:
        if seed is not None:
            self.gen.manual_seed(seed)
        self._reset_rows(torch.ones(self.num_envs, dtype=torch.bool))
        return self._obs()

    def step(self, action: torch.Tensor) -> StepResult:
        u = (action[:, 0] * self.max_torque).clamp(-self.max_torque, self.max_torque)
        th_norm = (self.th + math.pi) % (2 * math.pi) - math.pi
        cost = th_norm**2 + 0.1 * self.th_dot**2 + 0.001 * u**2
        th_dot = (
            self.th_dot
            + (3 * self.g / (2 * self.length) * self.th.sin() + 3.0 / (self.mass * self.length**2) * u) * self.dt
        )
        self.th_dot = th_dot.clamp(-self.max_speed, self.max_speed)
        self.th = self.th + self.th_dot * self.dt
        self.t += 1
        truncated = self.t >= self.max_episode_steps
        terminated = torch.zeros_like(truncated)
        final_obs = self._obs()
        if bool(truncated.any()):
            self._reset_rows(truncated)
        info: dict[str, Any] = {"final_obs": final_obs, "reward_terms": {"cost": -cost}, "success": truncated}
        return self._obs(), -cost, terminated, truncated, info

    def io_spec(self) -> IOSpec:
        return IOSpec((ObsField("cos_sin_thdot", 3),), (ActionField("torque", 1, "N m", scale=2.0),), self.dt)


def train(algo: Any, env: TorchPendulum, env_steps: int) -> None:
    """The trainer's loop in miniature: act, step, observe, update when ready."""
    obs = env.reset(seed=0)
    for _ in range(env_steps // env.num_envs):
        action = algo.act(obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        algo.observe(Transition(obs, action, reward, terminated, truncated, next_obs, info["final_obs"]))
        obs = next_obs
        if algo.ready_to_update():
            algo.update()


@torch.no_grad()
def mean_return(policy: Any, episodes: int = 32, seed: int = 123) -> float:
    """Mean undiscounted return of the deterministic policy over full episodes."""
    env = TorchPendulum(episodes, seed=seed)
    obs = env.reset(seed=seed)
    total = torch.zeros(episodes)
    for _ in range(env.max_episode_steps):
        obs, reward, _, _, _ = env.step(policy.act(obs, deterministic=True))
        total += reward
    return float(total.mean())


PENDULUM_SAC = SACCfg(
    batch_size=128,
    learning_starts=500,
    buffer_size_per_env=5_000,
    actor_hidden=(64, 64),
    critic_hidden=(64, 64),
    actor_lr=1e-3,
    critic_lr=1e-3,
    alpha_lr=1e-3,
    tau=0.02,
    updates_per_step=1,
)
PENDULUM_TD3 = FastTD3Cfg(
    batch_size=128,
    learning_starts=500,
    buffer_size_per_env=5_000,
    n_step=1,
    actor_hidden=(64, 64),
    critic_hidden=(64, 64),
    num_atoms=51,
    v_min=-200.0,
    v_max=0.0,
    actor_lr=1e-3,
    critic_lr=1e-3,
    weight_decay=0.0,
    tau=0.02,
    std_min=0.05,
    std_max=0.5,
    policy_noise=0.1,
    updates_per_step=1,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Small networks run fastest on one thread (and on shared CI cores, much faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("algo_cls", "cfg", "env_steps"),
    [(SAC, PENDULUM_SAC, 3_000), (FastTD3, PENDULUM_TD3, 4_000)],
    ids=["sac", "fasttd3"],
)
def test_learns_pendulum(algo_cls: type, cfg: Any, env_steps: int) -> None:
    torch.manual_seed(0)
    env = TorchPendulum(1, seed=0)
    algo = algo_cls(cfg, env)
    untrained = mean_return(algo.policy)
    train(algo, env, env_steps)
    trained = mean_return(algo.policy)
    # Swinging up from any start and holding scores about -150; doing nothing about -1200.
    assert untrained < -700, untrained
    assert trained > -300, f"mean return {trained:.1f} after {env_steps} steps"


def test_export_matches_deterministic_act() -> None:
    env = TorchPendulum(4)
    for algo in (SAC(PENDULUM_SAC, env), FastTD3(PENDULUM_TD3, env)):
        obs = env.reset(seed=1)
        obs_norm = algo.policy.obs_norm
        assert obs_norm is not None  # both configs normalize observations
        obs_norm.update(obs["policy"] * 3.0 + 1.0)  # non-trivial statistics
        exported = algo.policy.export_module()
        torch.testing.assert_close(exported(obs["policy"]), algo.policy.act(obs, deterministic=True))


VARIANTS: dict[str, tuple[type, Any]] = {
    "sac-ensemble-c51-layernorm": (
        SAC,
        dataclasses.replace(
            PENDULUM_SAC,
            num_critics=4,
            critic_subset=2,
            num_atoms=21,
            v_min=-100.0,
            v_max=0.0,
            critic_layer_norm=True,
            actor_q="mean",
            n_step=3,
            save_replay=True,
        ),
    ),
    "fasttd3-privileged-critic": (FastTD3, dataclasses.replace(PENDULUM_TD3, n_step=3, save_replay=True)),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_resume_continues_exactly(name: str, tmp_path: Any) -> None:
    """A checkpoint (saved and loaded as the trainer does) continues bit-exactly."""
    algo_cls, base_cfg = VARIANTS[name]
    env = TorchPendulum(3, critic=True, seed=4)
    cfg = dataclasses.replace(base_cfg, learning_starts=30, batch_size=32, updates_per_step=2)
    algo = algo_cls(cfg, env)
    train(algo, env, 150)
    assert algo.num_updates > 0
    torch.save(algo.state_dict(), tmp_path / "ckpt.pt")
    twin = algo_cls(cfg, TorchPendulum(3, critic=True, seed=4))
    twin.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    results = []
    for a in (algo, twin):
        torch.manual_seed(7)
        metrics = a.update()
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        results.append((metrics, [p.detach().clone() for p in a.policy.parameters()]))
    assert results[0][0] == results[1][0]
    for p, q in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


class DiscreteEnv(TorchPendulum):
    action_space_kind = "discrete"  # what the gymnasium adapter reports for Discrete spaces


@pytest.mark.parametrize("algo_cls", [SAC, FastTD3])
def test_rejects_discrete_actions(algo_cls: type) -> None:
    with pytest.raises(EmbodiedError, match="continuous"):
        algo_cls(PENDULUM_SAC if algo_cls is SAC else PENDULUM_TD3, DiscreteEnv(2))


def _pretend_native_bf16(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """Make torch's CPU feature probes (AVX-512 BF16, AMX) answer ``native``."""
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: native, raising=False)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_cpu_warns_only_without_native_support(
    native: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """bf16 autocast is emulated (slower) on CPUs without AVX-512 BF16 / AMX: say so at start."""
    _pretend_native_bf16(monkeypatch, native)
    with caplog.at_level("WARNING", logger="embodied.precision"):
        algo = SAC(dataclasses.replace(PENDULUM_SAC, bf16=True, learning_starts=8, batch_size=8), TorchPendulum(2))
        train(algo, TorchPendulum(2), 32)  # the bf16 gradient steps run on either kind of CPU
    warned = any("algo.bf16=auto or false" in r.getMessage() for r in caplog.records)
    assert warned is not native
    assert algo.use_bf16


@pytest.mark.parametrize("native", [True, False])
def test_bf16_auto_follows_the_cpu(
    native: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``algo.bf16=auto`` turns autocast on exactly where the CPU has native bf16, and logs why."""
    _pretend_native_bf16(monkeypatch, native)
    with caplog.at_level("INFO", logger="embodied.precision"):
        algo = SAC(dataclasses.replace(PENDULUM_SAC, bf16="auto", learning_starts=8, batch_size=8), TorchPendulum(2))
    assert algo.use_bf16 is native
    said = [r.getMessage() for r in caplog.records if "algo.bf16=auto" in r.getMessage()]
    assert len(said) == 1 and ("bfloat16 autocast on" in said[0]) is native


def test_bf16_setting_is_checked_by_name() -> None:
    """A typo in the precision setting is a config error naming the key, not a silent float32."""
    from embodied.config import ConfigError, apply_overrides

    with pytest.raises(ConfigError, match="bf16"):
        apply_overrides(PENDULUM_SAC, {"bf16": "fast"}, "cli")
