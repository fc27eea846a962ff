"""quad-track through the firmware's C: the observation of a moving setpoint (position, feed-forward
velocity and acceleration, yaw) equals the task's, in closed loop through quad_ctrl.c and through the
Crazyflie app's controllerOutOfTree (setpoint_t.velocity / .acceleration on the shim)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from export_support import near_hover_policy, needs_gcc, write_io

from embodied.crazyflie import firmware_build as fb
from embodied.crazyflie.sil import packed_state
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.policies.mlp import ExportedPolicy
from embodied.tasks.quadrotor.hover import QuadHover
from embodied.tasks.quadrotor.terms import heading_cos_sin, vec_w_to_h
from embodied.tasks.quadrotor.track import QuadTrack, QuadTrackCfg

CPU = torch.device("cpu")


def _near_hover(obs_dim: int, hover: float, seed: int) -> ExportedPolicy:
    """A random policy near hover (small output gain), so it flies (and sees the path) a while."""
    return near_hover_policy(obs_dim, hover, seed=seed, gain=0.02)


def _build(env: QuadHover, module: torch.nn.Module, tmp_path: Path) -> HostPolicyLib:
    io_path = write_io(module, env.io_spec(), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    return HostPolicyLib(fb.build_host_library(tmp_path / "c", tmp_path / "build"))


@needs_gcc
def test_c_tracking_observation_equals_the_task_in_closed_loop(tmp_path: Path) -> None:
    """The C controller flies the task along moving setpoints (all path kinds, every heading,
    restarts included): every observation it feeds the network equals the task's."""
    n = 16
    # Physical labels on both sides (the flip itself is checked in test_quad_yaw_symmetry.py).
    cfg = QuadTrackCfg(
        path="mix",
        action_history=2,
        obs_noise_std=(0.0,) * 4,
        episode_steps=40,
        pos_err_integral=True,
        yaw_symmetry=False,
    )
    env = QuadTrack(cfg, num_envs=n, device=CPU, seed=0)
    spec = env.io_spec()
    hover = float(spec.extra["hover_action"])
    module = _near_hover(spec.obs_dim, hover, seed=3)
    lib = _build(env, module, tmp_path)
    ctxs = lib.new_contexts(n, initial_action=hover)
    obs_task = env.observe(noise=False)["policy"].numpy()
    ended, peak_acc = 0, 0.0
    for _ in range(60):
        lib.reset(ctxs, (env.episode_step == 0).numpy(), hover)
        states, setpoints = packed_state(env)
        assert setpoints.shape == (n, 10)  # position, yaw, feed-forward velocity and acceleration
        actions = lib.step(ctxs, states, setpoints)
        # The network on the task's observation gives the C controller's action only if the C
        # observation (velocity error, feed-forward, integral, history) was the task's.
        np.testing.assert_allclose(actions, module(torch.from_numpy(obs_task)).numpy(), atol=1e-5, rtol=0)
        obs_c, clamped = lib.assemble_obs(ctxs, states, setpoints)
        assert clamped == 0
        np.testing.assert_allclose(obs_c[:, :24], obs_task[:, :24], atol=3e-7, rtol=0)
        obs, _, terminated, truncated, _ = env.step(torch.from_numpy(actions))
        obs_task = obs["policy"].numpy()
        ended += int((terminated | truncated).sum())
        peak_acc = max(peak_acc, float(np.abs(obs_task[:, 18:21]).max()))
    assert ended > 0 and peak_acc > 0.5  # restarts and a real feed-forward were both compared


@needs_gcc
def test_hover_policy_ignores_the_feed_forward(tmp_path: Path) -> None:
    """A hover policy (lin_vel_h) built from the same quad_ctrl.c reads only position and yaw of a
    moving setpoint: the feed-forward changes nothing."""
    from embodied.tasks.quadrotor.hover import QuadHoverCfg

    env = QuadHover(QuadHoverCfg(action_history=1), num_envs=4, device=CPU, seed=0)
    spec = env.io_spec()
    module = _near_hover(spec.obs_dim, float(spec.extra["hover_action"]), seed=1)
    lib = _build(env, module, tmp_path)
    ctxs = lib.new_contexts(4, initial_action=0.0)
    states, setpoints = packed_state(env)
    moving = np.concatenate((setpoints, np.full((4, 6), 0.7, np.float32)), axis=1)
    np.testing.assert_array_equal(
        lib.assemble_obs(ctxs, states, moving)[0], lib.assemble_obs(ctxs, states, setpoints)[0]
    )


@needs_gcc
def test_crazyflie_app_takes_the_setpoint_feed_forward(tmp_path: Path) -> None:
    """controllerOutOfTree (the app itself, on the shim) reads setpoint_t.velocity and
    .acceleration: in closed loop against the task, with the moving setpoint sent as the high-level
    commander sends it (modeAbs, position + velocity + acceleration + yaw in degrees), its motor
    command is the network's output on the task's observation at every policy step, and measurably
    not the command the same setpoint without its feed-forward would give."""
    cfg = QuadTrackCfg(action_history=1, obs_noise_std=(0.0,) * 4, init_level_fraction=1.0, episode_steps=200)
    env = QuadTrack(cfg, num_envs=1, device=CPU, seed=4)
    spec = env.io_spec()
    hover = float(spec.extra["hover_action"])
    module = _near_hover(spec.obs_dim, hover, seed=2)
    lib = _build(env, module, tmp_path)
    assert lib.has_app and lib.cf_init()
    lib.cf_param_set("enable", 1)
    max_thrust = float(spec.extra["max_thrust_per_motor_n"])
    min_thrust = float(spec.extra["min_thrust_per_motor_n"])
    thrust_max_fw = 0.1125  # THRUST_MAX of the shim's firmware version (2025.12, cf2)
    obs_task = env.observe(noise=False)["policy"]
    decimation = round(env.dt * 1000)  # stabilizer ticks (1 kHz) per policy step
    worst_gap = 0.0

    def app_forces(action: np.ndarray) -> np.ndarray:
        """normalizedForces the app sends for ``action``: T / THRUST_MAX, 0 below the cut."""
        thrust = (action.astype(np.float64) + 1.0) / 2.0 * max_thrust
        return np.where(thrust >= min_thrust, thrust / thrust_max_fw, 0.0)

    for step in range(30):
        raw = env.physical_state()
        estimate = torch.cat((raw["position_w"], raw["quat_wb"], raw["lin_vel_w"]), dim=1)[0].numpy()
        tick = step * decimation
        mode, forces, _ = lib.cf_tick(
            tick,
            estimate,
            np.degrees(raw["ang_vel_b"][0].numpy()),
            raw["setpoint_w"][0].numpy(),
            setpoint_timestamp_ms=tick,
            setpoint_yaw_deg=math.degrees(float(raw["yaw_sp_rad"][0])),
            setpoint_vel_w=raw["vel_sp_w"][0].numpy(),
            setpoint_acc_w=raw["acc_sp_w"][0].numpy(),
        )
        assert mode == 2  # the policy flies (force mode)
        action = module(obs_task).detach().numpy()[0]
        np.testing.assert_allclose(forces, app_forces(action), atol=1e-4, rtol=0)
        # Discriminating: the command for the same state without the feed-forward (velocity
        # error = velocity, no acceleration term) is measurably different.
        plain = obs_task.clone()
        plain[:, 12:15] = vec_w_to_h(raw["lin_vel_w"], heading_cos_sin(raw["yaw_sp_rad"]))
        plain[:, 18:21] = 0.0
        worst_gap = max(worst_gap, float(np.abs(app_forces(module(plain).detach().numpy()[0]) - forces).max()))
        obs, *_ = env.step(torch.from_numpy(action[None, :]))
        obs_task = obs["policy"]
    assert worst_gap > 1e-3
