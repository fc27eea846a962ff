"""The Isaac Lab adapter (sim/isaaclab.py) against the real Isaac Lab 3.0, kit-less.

Runs in ``.venv-isaaclab`` (``bash scripts/setup_isaaclab.sh``; Python 3.12), skipped elsewhere.
Isaac Lab's own Cartpole tasks, a ``DirectRLEnv`` (``Isaac-Cartpole-Direct``) and a
``ManagerBasedRLEnv`` (``Isaac-Cartpole``), run on Newton (MuJoCo-Warp solver) on warp's CPU
device, loading the Cartpole asset shipped in ``sim/assets/isaaclab`` (``env.asset_root=builtin``:
NVIDIA's asset server is not reachable here). A recorder between the adapter and the env keeps
what Isaac Lab itself returned on each step, and every check compares the adapter's output
with it.

Time: building an env takes ~35 s once warp has cached its kernels (~4-5 min the very first
time in a fresh environment); a step of 16 envs takes ~0.1 s on a 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from embodied import registry
from embodied.cli import main
from embodied.env import VecEnv, final_obs_exact
from embodied.sim.isaaclab import IsaacLabCfg, IsaacLabVecEnv, builtin_asset_root, make_isaaclab_env

if importlib.util.find_spec("isaaclab_tasks") is None:
    pytest.skip("needs Isaac Lab 3: bash scripts/setup_isaaclab.sh, then .venv-isaaclab", allow_module_level=True)
# Isaac Lab reads its asset root once, on its first import: before anything imports it
os.environ.setdefault("ISAACSIM_ASSET_ROOT", str(builtin_asset_root()))

N = 16
EPISODE_S = 0.5
"""Short episodes (30 control steps of 1/60 s): a cart pushed at full force leaves its 3 m rail
before the time-out (a termination), one left alone times out unless its pole falls first."""


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    return value


class Recorder:
    """Passes every call to the Isaac Lab env and keeps what it returned: the objects themselves
    (``raw``) and copies taken at return time (``seen``), plus the actions it was given."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.unwrapped = env.unwrapped
        self.raw: list[tuple[Any, ...]] = []
        self.seen: list[tuple[Any, ...]] = []
        self.actions: list[torch.Tensor] = []

    def reset(self, seed: int | None = None) -> Any:
        return self.env.reset(seed=seed)

    def step(self, action: torch.Tensor) -> Any:
        self.actions.append(action.clone())
        out = self.env.step(action)
        self.raw.append(out)
        self.seen.append(_clone(out))
        return out

    def close(self) -> None:
        self.env.close()


_LIVE: list[IsaacLabVecEnv] = []
"""The module fixture's env while it is open: Isaac Lab allows one simulation per process."""


def _close_live() -> None:
    while _LIVE:
        _LIVE.pop().close()


@pytest.fixture(scope="module", params=["Isaac-Cartpole-Direct", "Isaac-Cartpole"])
def wrapped(request: pytest.FixtureRequest) -> Iterator[tuple[IsaacLabVecEnv, Recorder]]:
    _close_live()
    cfg = IsaacLabCfg(task_id=request.param, asset_root="builtin", overrides=(f"env.episode_length_s={EPISODE_S}",))
    recorder = Recorder(make_isaaclab_env(cfg, N, torch.device("cpu"), seed=0))
    env = IsaacLabVecEnv.wrap(recorder, cfg, seed=0)
    _LIVE.append(env)
    yield env, recorder
    _close_live()


def test_spaces_device_and_timing_are_isaac_labs(wrapped: tuple[IsaacLabVecEnv, Recorder]) -> None:
    env, recorder = wrapped
    base = recorder.unwrapped
    assert isinstance(env, VecEnv)
    assert env.device == torch.device(base.device) == torch.device("cpu")
    assert (env.num_envs, env.dt, env.max_episode_steps) == (N, base.step_dt, base.max_episode_length)
    assert env.max_episode_steps == round(EPISODE_S / base.step_dt)
    obs, _ = recorder.env.reset(seed=1)
    assert set(obs) == {"policy"} and env.obs_spec == {"policy": tuple(obs["policy"].shape[1:])}
    assert env.action_dim == 1 and not bool(torch.isfinite(torch.as_tensor(base.single_action_space.high)).all())


def test_actions_reach_isaac_lab_clipped_and_unscaled(wrapped: tuple[IsaacLabVecEnv, Recorder]) -> None:
    """Cartpole's action space is unbounded (its own action_scale turns [-1, 1] into newtons)."""
    env, recorder = wrapped
    action = torch.linspace(-3.0, 3.0, N).unsqueeze(1)
    env.step(action)
    torch.testing.assert_close(recorder.actions[-1], action.clamp(-1.0, 1.0))
    assert recorder.actions[-1].device == env.device


def test_steps_match_what_isaac_lab_returned(wrapped: tuple[IsaacLabVecEnv, Recorder]) -> None:
    """Observations, rewards, terminated/time-outs and final observations, step by step, until
    every env ended at least once: time-outs (zero force) and terminations (full force pushes
    the cart past its 3 m limit) both occur."""
    env, recorder = wrapped
    env.reset(seed=2)
    ended = torch.zeros(N, dtype=torch.bool)
    kinds = {"terminated": 0, "truncated": 0}
    push = torch.zeros(N, 1)
    push[: N // 2] = 1.0  # half the carts at full force, half left alone
    for _ in range(2 * env.max_episode_steps + 2):
        obs, reward, terminated, truncated, info = env.step(push)
        (their_obs, their_reward, their_terminated, their_time_outs, extras) = recorder.seen[-1]
        torch.testing.assert_close(obs["policy"], their_obs["policy"])
        torch.testing.assert_close(reward, their_reward)
        assert terminated.tolist() == their_terminated.tolist()
        assert truncated.tolist() == (their_time_outs & ~their_terminated).tolist()
        assert not (terminated & truncated).any()
        done = terminated | truncated
        if done.any():
            # the ended rows: final_obs is the observation Isaac Lab computed before its reset,
            # the returned one its reset observation (episode counter back at 0)
            torch.testing.assert_close(info["final_obs"]["policy"][done], extras["final_obs"]["policy"][done])
            assert (recorder.unwrapped.episode_length_buf[done] == 0).all()
            assert not torch.allclose(info["final_obs"]["policy"][done], obs["policy"][done])
        torch.testing.assert_close(info["final_obs"]["policy"][~done], obs["policy"][~done])
        kinds["terminated"] += int(terminated.sum())
        kinds["truncated"] += int(truncated.sum())
        ended |= done
    assert ended.all() and kinds["terminated"] > 0 and kinds["truncated"] > 0, kinds
    assert env.exact_final_obs and final_obs_exact(env)


def test_isaac_labs_reused_buffers_do_not_leak_through(wrapped: tuple[IsaacLabVecEnv, Recorder]) -> None:
    """Isaac Lab returns the same terminated / time-out / reward tensors every step, overwritten in
    place; the adapter's outputs are copies that the next step leaves alone."""
    env, recorder = wrapped
    first = env.step(torch.ones(N, 1))
    second = env.step(-torch.ones(N, 1))
    raw_first, raw_second = recorder.raw[-2], recorder.raw[-1]
    assert raw_first[2] is raw_second[2] and raw_first[3] is raw_second[3]  # Isaac Lab's own reuse
    for ours, raw in ((first[1], raw_first[1]), (first[2], raw_first[2]), (first[0]["policy"], raw_first[0]["policy"])):
        assert ours.data_ptr() != raw.data_ptr()
    seen_first = recorder.seen[-2]
    torch.testing.assert_close(first[1], seen_first[1])  # still what step one returned
    assert first[2].tolist() == seen_first[2].tolist()
    assert second[0]["policy"].data_ptr() != first[0]["policy"].data_ptr()


def test_registry_builds_the_task_by_name() -> None:
    _close_live()
    name = "isaaclab:Isaac-Cartpole-Direct"
    cfg = registry.task_cfg(name)
    from embodied.config import apply_overrides

    cfg = apply_overrides(cfg, {"asset_root": "builtin"}, "test")
    env = registry.make_env(name, cfg, 4, "cpu", seed=0)
    try:
        obs, reward, *_ = env.step(torch.zeros(4, 1))
        assert obs["policy"].shape == (4, 4) and reward.shape == (4,)
    finally:
        env.close()


def test_unknown_task_is_a_named_error() -> None:
    from embodied.config import ConfigError

    with pytest.raises(ConfigError, match=r"unknown task 'Isaac-Cartpol-Direct'.*Isaac-Cartpole-Direct"):
        make_isaaclab_env(IsaacLabCfg(task_id="Isaac-Cartpol-Direct", asset_root="builtin"), 2, torch.device("cpu"), 0)


def test_train_takes_isaac_labs_rsl_rl_agent_config(capsys: pytest.CaptureFixture[str]) -> None:
    """``embodied train isaaclab:<TaskId>`` starts from the task's own RSL-RL runner config."""
    assert main(["train", "isaaclab:Isaac-Cartpole-Direct", "--num-envs", "8", "--print-config"]) == 0
    out = capsys.readouterr().out
    # CartpoleDirectPPORunnerCfg: 16 steps per env, [32, 32] elu, 5 epochs, entropy 0.005,
    # 150 iterations -> 150 x 16 x 8 env steps
    for line in (
        "algo.num_steps_per_env = 16",
        "algo.actor_hidden = (32, 32)",
        "algo.activation = 'elu'",
        "algo.num_epochs = 5",
        "algo.entropy_coef = 0.005",
        "trainer.total_env_steps = 19200",
        "trainer.eval_episodes = 0",
    ):
        assert line in out, line


@pytest.mark.slow
def test_ppo_learns_the_direct_cartpole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PPO through embodied's trainer on Isaac Lab's direct Cartpole with Isaac Lab's own agent
    config (120 of its iterations at 64 envs), then ``embodied eval`` (Isaac Lab holds one
    simulation per process, so the evaluation env is built after training closed its env): the
    policy balances the pole for most of the 5 s episode and earns a return random actions do not
    (random pushes often keep the pole up too, but at cart and pole speeds the reward penalizes)."""
    _close_live()
    random_return, random_length = _random_policy_return()
    run_dir = tmp_path / "run"
    code = main([
        "train", "isaaclab:Isaac-Cartpole-Direct", "--num-envs", "64", "--device", "cpu", "--no-progress",
        "--run-dir", str(run_dir), "env.asset_root=builtin", "trainer.total_env_steps=122880",
    ])  # fmt: skip
    assert code == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mean_episode_length"] > 250, result  # of 300 steps
    assert result["mean_return"] > random_return + 2.0, (result, random_return, random_length)


def _random_policy_return() -> tuple[float, float]:
    """Mean return and episode length of uniform random actions on the same task (16 envs, first episodes)."""
    cfg = IsaacLabCfg(task_id="Isaac-Cartpole-Direct", asset_root="builtin")
    env = IsaacLabVecEnv(cfg, 16, "cpu", seed=1)
    try:
        totals, returns = torch.zeros(16), torch.full((16,), float("nan"))
        lengths = torch.full((16,), float(env.max_episode_steps))
        gen = torch.Generator().manual_seed(0)
        for t in range(env.max_episode_steps):
            _, reward, terminated, truncated, _ = env.step(torch.rand(16, 1, generator=gen) * 2 - 1)
            totals += reward
            first_end = (terminated | truncated) & returns.isnan()
            returns[first_end] = totals[first_end]
            lengths[first_end] = t + 1
            if not returns.isnan().any():
                break
        return float(torch.where(returns.isnan(), totals, returns).mean()), float(lengths.mean())
    finally:
        env.close()
