"""Reality-gap models of the quadrotor task: each one switches on and off and does what it says."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from quad_support import level_at_rest

from embodied.config import ConfigError
from embodied.experiment import resolve_experiment
from embodied.sim.quadrotor import RandomizationCfg
from embodied.tasks.quadrotor.gaps import QuadGapCfg
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

CPU = torch.device("cpu")


def make(n: int = 8, setpoint_z_m: float = 1.0, **gaps: Any) -> QuadHover:
    cfg = QuadHoverCfg(
        setpoint_w=(0.0, 0.0, setpoint_z_m),
        obs_noise_std=(0.0,) * 4,
        disturbance_force_std_n=0.0,
        disturbance_torque_std_nm=0.0,
        setpoint_yaw_range_rad=0.0,
        yaw_symmetry=False,  # compared with the physical observation (_observe)
        gaps=QuadGapCfg(**gaps),  # its __post_init__ checks the values
    )
    return QuadHover(cfg, n, CPU, seed=0)


def test_all_off_by_default() -> None:
    assert not QuadGapCfg().enabled
    assert QuadHover(QuadHoverCfg(), 2, CPU, seed=0).gaps is None
    assert QuadGapCfg(ground_effect=True).enabled and QuadGapCfg(obs_delay_steps=(0, 1)).enabled


def test_observation_delay_shows_an_old_state() -> None:
    env = make(obs_delay_steps=(2, 2))
    gen = torch.Generator().manual_seed(0)
    clean: list[torch.Tensor] = [env._observe(None)["policy"][:, :18]]
    seen: list[torch.Tensor] = []
    for _ in range(6):
        obs = env.step(env.hover_action + 0.2 * torch.randn(8, 4, generator=gen))[0]["policy"]
        clean.append(env._observe(None)["policy"][:, :18])
        seen.append(obs[:, :18])
    for k in range(2, 6):
        assert torch.equal(seen[k], clean[k + 1 - 2])
    assert not torch.equal(seen[5], clean[6])
    # The action history is not delayed: the policy knows what it sent.
    assert torch.equal(obs[:, 18:22], env.action_hist[:, :4])


def test_motor_delay_applies_old_commands() -> None:
    delayed, direct = make(motor_delay_steps=(1, 1)), make()
    full = torch.ones(8, 4)
    for env in (delayed, direct):
        env.set_physical_state(position_w=[0.0, 0.0, 1.0], **level_at_rest())
    delayed.step(full)  # the motors still get the hover command of the reset
    direct.step(torch.full((8, 4), direct.hover_action))
    assert torch.allclose(delayed.sim.state, direct.sim.state, atol=1e-6)
    delayed.step(-full)  # now they get the full command
    direct.step(full)
    assert torch.allclose(delayed.sim.state, direct.sim.state, atol=1e-6)


def test_gyro_bias_and_noise() -> None:
    n = 2048
    biased = make(n, gyro_bias_std_rad_s=0.02)
    err = [biased.observe(noise=False)["policy"][:, 15:18] - biased.sim.ang_vel_b for _ in range(2)]
    assert torch.equal(err[0], err[1])  # a bias: constant within the episode
    assert err[0].std().item() == pytest.approx(0.02, rel=0.1)
    noisy = make(n, gyro_noise_std_rad_s=0.01)
    diff = noisy.observe()["policy"][:, 15:18] - noisy.observe()["policy"][:, 15:18]
    assert diff.std().item() == pytest.approx(0.01 * math.sqrt(2.0), rel=0.1)


def test_estimator_position_and_velocity_errors() -> None:
    env = make(4096, pos_bias_std_m=0.01, pos_noise_std_m=0.002, lin_vel_noise_std_mps=0.03)
    truth = env._observe(None)["policy"]
    a, b = env.observe()["policy"], env.observe()["policy"]
    assert (a[:, 0:3] - truth[:, 0:3]).std().item() == pytest.approx(math.hypot(0.01, 0.002), rel=0.1)
    assert (a[:, 0:3] - b[:, 0:3]).std().item() == pytest.approx(0.002 * math.sqrt(2.0), rel=0.1)
    assert (a[:, 12:15] - truth[:, 12:15]).std().item() == pytest.approx(0.03, rel=0.1)
    assert torch.equal(a[:, 3:12], truth[:, 3:12])  # attitude untouched


def test_thrust_mismatch_and_battery_sag() -> None:
    env = make(512, thrust_mismatch=(0.8, 1.2), battery_sag=(0.3, 0.3))
    assert env.gaps is not None
    thrust_scale = env.gaps.rpm_scale.square()
    assert 0.8 <= thrust_scale.min().item() < 0.82 and 1.18 < thrust_scale.max().item() <= 1.2
    max_rpm = env.cfg.sim.params.max_rpm
    _, cap_start = env.gaps.rpm_limits(torch.zeros(512, dtype=torch.long), max_rpm)
    _, cap_end = env.gaps.rpm_limits(torch.full((512,), env.cfg.episode_steps), max_rpm)
    assert torch.allclose(cap_start, torch.full((512, 1), max_rpm))
    assert torch.allclose(cap_end.square() / max_rpm**2, torch.full((512, 1), 0.7))  # 30 % of the thrust lost
    # A full command late in the episode reaches the sagged cap, not the full motor speed.
    env.set_physical_state(episode_step=450, position_w=[0.0, 0.0, 1.0], **level_at_rest())
    for _ in range(30):
        env.step(torch.ones(512, 4))
    sagged_cap = max_rpm * math.sqrt(1.0 - 0.3 * 480 / 500)
    assert sagged_cap * 0.97 <= env.sim.motor_rpm.max().item() <= sagged_cap * 1.005


def test_body_drag_decelerates() -> None:
    drag = (0.01, 0.01, 0.02)
    env, free = make(1, body_drag_n_per_mps=drag), make(1)
    for e in (env, free):
        e.set_physical_state(position_w=[0.0, 0.0, 1.0], quat_wb=[1.0, 0, 0, 0], lin_vel_w=[1.0, 0.0, 0.0])
        e.set_physical_state(ang_vel_b=[0.0] * 3, motor_rpm=[e.cfg.sim.params.hover_rpm] * 4)
        e.step(torch.full((1, 4), e.hover_action))
    dv = (env.sim.lin_vel_w - free.sim.lin_vel_w)[0]
    assert dv[0].item() == pytest.approx(-drag[0] * 1.0 / 0.027 * 0.01, rel=0.02)
    assert abs(dv[1].item()) < 1e-6


def test_ground_effect_only_near_the_ground() -> None:
    def vertical_acc(z: float, on: bool) -> float:
        # A low setpoint so that heights near the ground (z = 0) are inside the 0.6 m box.
        env = make(1, 0.7, ground_effect=on) if on else make(1, 0.7)
        env.set_physical_state(position_w=[0.0, 0.0, z], **level_at_rest())
        env.set_physical_state(motor_rpm=[env.cfg.sim.params.hover_rpm] * 4)
        env.step(torch.full((1, 4), env.hover_action))
        return env.sim.lin_vel_w[0, 2].item() / 0.01

    near = vertical_acc(0.12, True) - vertical_acc(0.12, False)
    gain = 1.0 / (1.0 - (0.0231 / (4 * 0.12)) ** 2) - 1.0  # 0.23 % more thrust at 12 cm
    assert near == pytest.approx(9.81 * gain, rel=0.05)
    assert 0.0 < vertical_acc(1.2, True) - vertical_acc(1.2, False) < 0.1 * near


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"obs_delay_steps": (2, 1)}, "obs_delay_steps"),
        ({"motor_delay_steps": (0, 1.5)}, "motor_delay_steps"),
        ({"gyro_noise_std_rad_s": float("nan")}, "gyro_noise_std_rad_s"),
        ({"thrust_mismatch": (0.0, 1.0)}, "thrust_mismatch"),
        ({"battery_sag": (0.0, 1.0)}, "battery_sag"),
        ({"body_drag_n_per_mps": (0.0, -1.0, 0.0)}, "body_drag_n_per_mps"),
    ],
)
def test_config_validation(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        QuadGapCfg(**changes)  # type: ignore[arg-type]


def test_robust_preset_loads_and_enables_every_model() -> None:
    from embodied.commands.train import preset_file

    path = preset_file("quad-hover", "ppo", "robust")
    cfg = resolve_experiment("quad-hover", "ppo", path)
    gaps = cfg.env.gaps
    assert gaps.enabled and gaps.ground_effect and gaps.obs_delay_steps[1] > 0 and gaps.motor_delay_steps[1] > 0
    assert gaps.thrust_mismatch != (1.0, 1.0) and gaps.battery_sag[1] > 0 and min(gaps.body_drag_n_per_mps) > 0
    assert gaps.gyro_bias_std_rad_s > 0 and gaps.gyro_noise_std_rad_s > 0 and gaps.pos_noise_std_m > 0
    env = QuadHover(dataclasses.replace(cfg.env), 4, CPU, seed=0)
    assert env.step(torch.zeros(4, 4))[0]["policy"].shape == (4, cfg.env.obs_dim)
    with pytest.raises(ConfigError, match="robust"):
        preset_file("quad-hover", "ppo", "nonexistent")
    from embodied.commands.train import list_presets

    assert "ppo.robust" in next(li for li in list_presets().splitlines() if "quad_hover:" in li)  # `train --help`


def test_curriculum_scales_every_draw_towards_the_nominal_vehicle() -> None:
    """``randomization_ramp``: at progress 0 every per-episode draw is nominal, at half the ramp
    the draws span half their ranges, at the end (and in an env never told) the full ranges."""
    gaps: dict[str, Any] = {
        "obs_delay_steps": (2, 2),
        "motor_delay_steps": (1, 1),
        "thrust_mismatch": (0.8, 0.8),
        "battery_sag": (0.2, 0.2),
        "pos_bias_std_m": 0.01,
        "gyro_bias_std_rad_s": 0.01,
    }
    cfg = QuadHoverCfg(gaps=QuadGapCfg(**gaps), randomization_ramp=0.5)
    cfg = dataclasses.replace(
        cfg, sim=dataclasses.replace(cfg.sim, randomization=RandomizationCfg(mass_scale=(1.2, 1.2)))
    )
    env = QuadHover(cfg, 16, CPU, seed=0)
    assert env.gaps is not None
    full = (env.gaps.obs_delay.clone(), env.gaps.rpm_scale.clone(), env.gaps.pos_bias.clone())
    assert env.randomization_scale == 1.0 and torch.allclose(env.sim.param_scales[:, 0], torch.tensor(1.2))
    for progress, s in ((0.0, 0.0), (0.25, 0.5), (0.9, 1.0)):
        env.set_training_progress(progress)
        env.reset(seed=0)
        g = env.gaps
        assert g is not None
        assert env.randomization_scale == s
        assert torch.allclose(env.sim.param_scales[:, 0], torch.tensor(1.0 + 0.2 * s))
        assert torch.equal(g.obs_delay, (full[0] * s).round().long())
        assert torch.equal(g.motor_delay, torch.full((16,), round(s)))
        assert torch.allclose(g.rpm_scale, torch.full((16, 4), math.sqrt(1.0 - 0.2 * s)))
        assert torch.allclose(g.sag_per_step, torch.full((16, 1), 0.2 * s / cfg.episode_steps))
        assert torch.allclose(g.pos_bias, full[2] * s)
    assert torch.equal(g.rpm_scale, full[1])  # the full range keeps its exact arithmetic
    with pytest.raises(ConfigError, match="randomization_ramp"):
        QuadHoverCfg(randomization_ramp=1.5)


def test_sweep_preset_trains_on_every_range_verify_sweeps() -> None:
    """``--preset sweep`` trains on the whole range of each perturbation of ``embodied verify``'s
    default sweep that the nominal policy fails or barely holds (mass, motor lag, observation delay,
    thrust spread), and leaves the rest untrained (inertia and yaw torque, held at 97-98 %; motor
    delay and battery sag, not swept): widening the sweep without the preset fails here."""
    from embodied.commands.train import preset_file
    from embodied.verify.gates import DEFAULT_SWEEP

    cfg = resolve_experiment("quad-hover", "ppo", preset_file("quad-hover", "ppo", "sweep"))
    env, rand = cfg.env, cfg.env.sim.randomization
    trained = {
        "mass_scale": rand.mass_scale,
        "motor_tau_scale": rand.motor_tau_scale,
        "obs_delay_steps": env.gaps.obs_delay_steps,
        "thrust_mismatch": (1.0 - env.gaps.thrust_mismatch[0], env.gaps.thrust_mismatch[1] - 1.0),
    }
    for knob, (low, high) in trained.items():
        values = DEFAULT_SWEEP[knob]
        if knob == "thrust_mismatch":  # the sweep's m is U(1 - m, 1 + m): both sides must reach m
            assert min(low, high) >= max(values) - 1e-9, (knob, low, high, values)
        else:
            assert low <= min(values) and max(values) <= high, (knob, low, high, values)
    assert (
        rand.inertia_scale == (1.0, 1.0) and env.gaps.motor_delay_steps == (0, 0) and env.gaps.battery_sag == (0.0, 0.0)
    )
    assert env.pos_err_integral and env.action_history >= 2 and 0.0 < env.randomization_ramp_start < 1.0
    # env.sim.compile=true would run every one of its gap models inside the fused step.
    assert env.gaps.fusable
    QuadHover(cfg.env, 4, CPU, seed=0).step(torch.zeros(4, 4))


@pytest.mark.parametrize(
    ("ramp", "start", "expected"),
    [
        (0.1, 0.15, ((0.0, 0.0), (0.15, 0.0), (0.2, 0.5), (0.25, 1.0), (0.9, 1.0))),
        (0.0, 0.3, ((0.0, 0.0), (0.3, 0.0), (0.31, 1.0))),  # no ramp: the full ranges switch on
    ],
)
def test_curriculum_start_keeps_the_nominal_vehicle_until_it(
    ramp: float, start: float, expected: tuple[tuple[float, float], ...]
) -> None:
    """``randomization_ramp_start``: the nominal vehicle until that fraction of training, then the
    ramp as before; the draws follow the scale (mass x1.2 drawn, 1 + 0.2 s used)."""
    cfg = QuadHoverCfg(randomization_ramp=ramp, randomization_ramp_start=start)
    cfg = dataclasses.replace(
        cfg, sim=dataclasses.replace(cfg.sim, randomization=RandomizationCfg(mass_scale=(1.2, 1.2)))
    )
    env = QuadHover(cfg, 4, CPU, seed=0)
    for progress, s in expected:
        env.set_training_progress(progress)
        env.reset(seed=0)
        assert env.randomization_scale == pytest.approx(s)
        assert torch.allclose(env.sim.param_scales[:, 0], torch.tensor(1.0 + 0.2 * s))
    with pytest.raises(ConfigError, match="randomization_ramp_start"):
        QuadHoverCfg(randomization_ramp_start=-0.1)


def test_critic_gap_inputs_show_each_episodes_draws_to_the_critic_only() -> None:
    """With ``critic_gap_inputs`` the critic's last 6 entries are this episode's observation and
    motor delay (over the range's maximum) and the 4 motors' thrust mismatch (over the range's
    largest deviation); they are redrawn for the envs that restart, and the policy never sees them."""

    def build(critic_gap_inputs: bool, **gaps: Any) -> QuadHover:
        cfg = QuadHoverCfg(critic_gap_inputs=critic_gap_inputs, gaps=QuadGapCfg(**gaps))
        return QuadHover(cfg, 64, CPU, seed=0)

    ranges = {"obs_delay_steps": (0, 2), "motor_delay_steps": (1, 1), "thrust_mismatch": (0.9, 1.1)}
    env, plain = build(True, **ranges), build(False, **ranges)
    assert env.cfg.critic_dim == plain.cfg.critic_dim + 6 == env.obs_spec["critic"][0]
    obs = env.reset()
    assert obs["critic"].shape == (64, env.cfg.critic_dim)
    assert obs["policy"].shape == plain.reset()["policy"].shape
    gaps = env.gaps
    assert gaps is not None
    seen = obs["critic"][:, -6:]
    assert torch.allclose(seen[:, 0], gaps.obs_delay.float() / 2)
    assert set(seen[:, 0].tolist()) == {0.0, 0.5, 1.0}
    assert torch.equal(seen[:, 1], torch.ones(64))  # motor delay fixed at its maximum
    assert torch.allclose(seen[:, 2:], (gaps.rpm_scale.square() - 1.0) / 0.1, atol=1e-5)
    assert seen[:, 2:].abs().max() <= 1.0 + 1e-5 and seen[:, 2:].std() > 0.3
    # A restart redraws them, and the critic sees the new draw from the restart's first observation.
    env._reset_envs(torch.arange(64) < 32)  # what step() does for the envs whose episode ended
    after = env.observe(noise=False)["critic"][:, -6:]
    assert not torch.equal(after[:32], seen[:32]) and torch.equal(after[32:], seen[32:])
    assert torch.allclose(after[:, 2:], (gaps.rpm_scale.square() - 1.0) / 0.1, atol=1e-5)
    # Without gap models the six entries are zeros (the key alone changes only the size).
    none = QuadHover(QuadHoverCfg(critic_gap_inputs=True), 4, CPU, seed=0)
    assert torch.equal(none.reset()["critic"][:, -6:], torch.zeros(4, 6))
