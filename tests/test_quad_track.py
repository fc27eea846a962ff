"""quad-track: reference paths (shape, period, bounds), the moving setpoint in the observation and
reward, the RMS success rule, evaluation metrics and the registry entry."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from embodied.config import ConfigError
from embodied.registry import make_env, task_cfg
from embodied.tasks.quadrotor.terms import heading_cos_sin, vec_w_to_h
from embodied.tasks.quadrotor.track import (
    Paths,
    QuadTrack,
    QuadTrackCfg,
    circle_paths,
    figure8_paths,
    random_paths,
)
from embodied.training.evaluate import evaluate

CPU = torch.device("cpu")


def quiet(**changes: Any) -> QuadTrackCfg:
    """No observation noise or disturbances, for exact expectations."""
    base = QuadTrackCfg(obs_noise_std=(0.0,) * 4, disturbance_force_std_n=0.0, disturbance_torque_std_nm=0.0)
    return dataclasses.replace(base, **changes)


def sample(paths: Paths, t_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[T, N, 3]`` position, velocity and acceleration of every path at times ``t_s [T]``."""
    n, steps = paths.amp.shape[0], t_s.shape[0]
    tiled = Paths(*(x.repeat(steps, *([1] * (x.dim() - 1))) for x in (paths.amp, paths.omega, paths.phase, paths.yaw)))
    out = tiled.at(t_s.repeat_interleave(n))
    return out[0].reshape(steps, n, 3), out[1].reshape(steps, n, 3), out[2].reshape(steps, n, 3)


def test_figure8_extent_period_and_start() -> None:
    paths = figure8_paths(2, (1.0, 0.5), 5.0, CPU)
    t = torch.linspace(0.0, 5.0, 2001)
    pos, vel, _ = sample(paths, t)
    assert torch.equal(pos[0], torch.zeros(2, 3))  # starts at the centre
    extent = pos.amax(dim=0) - pos.amin(dim=0)
    torch.testing.assert_close(extent[0], torch.tensor([1.0, 0.5, 0.0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(pos[-1], pos[0], atol=1e-5, rtol=0)  # one lap in 5 s
    # Half a lap later x is back at the centre and y too (the crossing of the eight).
    torch.testing.assert_close(pos[1000, 0], torch.zeros(3), atol=1e-5, rtol=0)
    assert float(vel[:, 0, 0].abs().max()) == pytest.approx(0.5 * 2 * math.pi / 5.0, rel=1e-4)


def test_circle_radius_and_period() -> None:
    paths = circle_paths(1, 0.5, 4.0, CPU)
    t = torch.linspace(0.0, 4.0, 801)
    pos, vel, acc = sample(paths, t)
    centre = torch.tensor([0.0, 0.5, 0.0])
    torch.testing.assert_close(torch.linalg.vector_norm(pos[:, 0] - centre, dim=1), torch.full((801,), 0.5))
    speed = torch.linalg.vector_norm(vel[:, 0], dim=1)
    torch.testing.assert_close(speed, torch.full((801,), 0.5 * 2 * math.pi / 4.0))
    torch.testing.assert_close(torch.linalg.vector_norm(acc[:, 0], dim=1), torch.full((801,), 0.5 * (math.pi / 2) ** 2))
    torch.testing.assert_close(pos[-1, 0], pos[0, 0], atol=1e-5, rtol=0)


def test_random_paths_bounded_smooth_and_consistent() -> None:
    g = torch.Generator().manual_seed(3)
    paths = random_paths(256, 3, (2.0, 8.0), 1.0, 2.0, 0.2, g, CPU)
    dt = 0.005
    t = torch.arange(0.0, 8.0, dt)
    pos, vel, acc = sample(paths, t)
    assert torch.equal(pos[0], torch.zeros(256, 3))
    assert float(torch.linalg.vector_norm(vel, dim=2).max()) <= 1.0 + 1e-5
    assert float(torch.linalg.vector_norm(acc, dim=2).max()) <= 2.0 + 1e-5
    assert float(pos[..., 2].abs().max()) <= 0.2 + 1e-6
    # Not degenerate: the paths really move (a bound reached by scaling, not by zeros).
    assert float(torch.linalg.vector_norm(vel, dim=2).amax(dim=0).median()) > 0.3
    # Velocity and acceleration are the derivatives of the position (central differences).
    torch.testing.assert_close((pos[2:] - pos[:-2]) / (2 * dt), vel[1:-1], atol=2e-3, rtol=0)
    torch.testing.assert_close((vel[2:] - vel[:-2]) / (2 * dt), acc[1:-1], atol=5e-3, rtol=0)
    # Different envs draw different paths.
    assert not torch.allclose(pos[:, 0], pos[:, 1])


def test_path_yaw_rotates_the_path() -> None:
    base = figure8_paths(1, (1.0, 0.5), 5.0, CPU)
    turned = Paths(base.amp, base.omega, base.phase, torch.tensor([math.pi / 2]))
    t = torch.tensor([0.7])
    p0, v0, a0 = base.at(t)
    p1, v1, a1 = turned.at(t)
    for before, after in ((p0, p1), (v0, v1), (a0, a1)):
        torch.testing.assert_close(after, torch.stack((-before[:, 1], before[:, 0], before[:, 2]), 1))


def test_observation_follows_the_moving_setpoint() -> None:
    env = QuadTrack(quiet(path="mix", action_history=2), 16, CPU, seed=0)
    for _ in range(7):
        obs, *_ = env.step(torch.full((16, 4), env.hover_action))
    raw = env.physical_state()
    assert raw["setpoint_w"].shape == raw["vel_sp_w"].shape == raw["acc_sp_w"].shape == (16, 3)
    t = env.episode_step.float() * env.dt
    pos, vel, acc = env.paths.at(t)
    torch.testing.assert_close(raw["setpoint_w"], torch.tensor(env.cfg.setpoint_w) + pos)
    heading = heading_cos_sin(raw["yaw_sp_rad"])
    policy = obs["policy"]
    names = [f.name for f in env.io_spec().obs_fields]
    assert names == ["pos_err_h", "rot_hb", "lin_vel_err_h", "ang_vel_b", "acc_sp_h", "prev_actions"]
    assert policy.shape == (16, 18 + 3 + 8) == (16, *env.obs_spec["policy"])
    assert obs["critic"].shape == (16, *env.obs_spec["critic"]) == (16, 37)
    torch.testing.assert_close(policy[:, 0:3], vec_w_to_h(raw["position_w"] - raw["setpoint_w"], heading))
    torch.testing.assert_close(policy[:, 12:15], vec_w_to_h(raw["lin_vel_w"] - vel, heading))
    torch.testing.assert_close(policy[:, 18:21], vec_w_to_h(acc, heading))
    assert float(policy[:, 18:21].abs().max()) > 0.1  # the feed-forward is really there


def test_start_moves_with_the_path() -> None:
    cfg = quiet(init_level_fraction=1.0, path_yaw_range_rad=0.0)
    env = QuadTrack(cfg, 4, CPU, seed=1)
    raw = env.physical_state()
    _, vel0, _ = env.paths.at(torch.zeros(4))
    torch.testing.assert_close(raw["lin_vel_w"], vel0)
    assert float(vel0[:, 0].abs().min()) > 0.5  # the figure-eight starts at speed
    # Level on the path at the path's velocity: zero velocity error in the observation.
    torch.testing.assert_close(env.observe(noise=False)["policy"][:, 12:15], torch.zeros(4, 3), atol=1e-6, rtol=0)


def test_rms_success_rule() -> None:
    steps = 40
    cfg = quiet(episode_steps=steps, init_level_fraction=0.0)
    env = QuadTrack(dataclasses.replace(cfg, success_rms_m=1.0), 32, CPU, seed=2)
    sq = torch.zeros(32, dtype=torch.float64)
    for _ in range(steps):
        _, _, terminated, truncated, info = env.step(torch.full((32, 4), env.hover_action))
        final = info["final_obs"]["policy"]
        sq += final[:, 0:3].double().square().sum(dim=1)
        assert not bool(terminated.any())
    assert bool(truncated.all())
    rms = info["episode_metrics"]["rms_error_m"]
    torch.testing.assert_close(rms.double(), torch.sqrt(sq / steps), atol=1e-6, rtol=0)
    assert bool(info["success"].all())  # every RMS is below 1 m
    # The same episodes with a threshold between the RMS values: success exactly where RMS < it.
    threshold = float(rms.median())
    env = QuadTrack(dataclasses.replace(cfg, success_rms_m=threshold), 32, CPU, seed=2)
    for _ in range(steps):
        *_, info = env.step(torch.full((32, 4), env.hover_action))
    assert torch.equal(info["success"], info["episode_metrics"]["rms_error_m"] < threshold)
    assert 0 < int(info["success"].sum()) < 32


def test_early_termination_is_no_success() -> None:
    env = QuadTrack(quiet(success_rms_m=10.0), 8, CPU, seed=0)
    for _ in range(200):  # motors off: falls out of the box long before the episode ends
        _, _, terminated, _, info = env.step(torch.full((8, 4), -1.0))
        if bool(terminated.any()):
            break
    assert bool(terminated.any()) and not bool((info["success"] & terminated).any())


def test_eval_reports_rms_and_registry() -> None:
    default = task_cfg("quad-track")
    assert isinstance(default, QuadTrackCfg)
    cfg = dataclasses.replace(default, episode_steps=30, path="circle")
    result = evaluate(
        lambda env: lambda obs: torch.full((obs["policy"].shape[0], 4), 0.2),
        lambda n, seed: make_env("quad-track", cfg, n, CPU, seed),
        episodes=8,
        seed=0,
    )
    assert "rms_error_m" in result.as_dict() and result.metrics["rms_error_m"] > 0.0


def test_state_dict_resumes_bit_exactly() -> None:
    cfg = quiet(path="random", episode_steps=20)
    a = QuadTrack(cfg, 8, CPU, seed=0)
    act = torch.full((8, 4), 0.1)
    for _ in range(15):
        a.step(act)
    b = QuadTrack(cfg, 8, CPU, seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(10):
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(act)
        assert torch.equal(oa["policy"], ob["policy"]) and torch.equal(ra, rb)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"path": "spiral"}, "path must be one of"),
        ({"period_s": 0.0}, "period_s"),
        ({"random_period_s": (3.0, 1.0)}, "random_period_s"),
        ({"random_components": 4}, "random_components"),
        ({"path": "random", "random_max_dz_m": 0.5}, "random_max_dz_m"),
        ({"path_yaw_range_rad": 4.0}, "path_yaw_range_rad"),
    ],
)
def test_bad_config_is_a_named_error(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        QuadTrackCfg(**changes)
