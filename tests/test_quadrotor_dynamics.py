"""Physics of the built-in quadrotor: gravity, hover, torque signs per conventions.md, motor lag,
conservation laws under RK4, quaternion norm, determinism and domain randomization."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from embodied.config import ConfigError
from embodied.sim.quadrotor import (
    ANG_VEL,
    LIN_VEL,
    POS,
    QUAT,
    RPM,
    Quadrotor,
    QuadrotorCfg,
    QuadrotorParams,
    RandomizationCfg,
    quat_to_rot,
    rk4_step,
)

CPU = torch.device("cpu")


def make(cfg: QuadrotorCfg | None = None, n: int = 1, seed: int = 0) -> Quadrotor:
    return Quadrotor(cfg or QuadrotorCfg(ground_z_m=None), n, CPU, torch.Generator().manual_seed(seed))


def run(sim: Quadrotor, rpm_cmd: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        sim.step(rpm_cmd)


def test_free_fall_accelerates_at_g() -> None:
    sim = make()
    run(sim, torch.zeros(1, 4), 50)  # 0.5 s with motors off
    t_s = 0.5
    g = sim.cfg.params.gravity_mps2
    assert sim.lin_vel_w[0, 2].item() == pytest.approx(-g * t_s, rel=1e-5)
    assert sim.position_w[0, 2].item() == pytest.approx(-0.5 * g * t_s**2, rel=1e-5)
    assert sim.position_w[0, :2].abs().max().item() == 0.0


def test_hover_thrust_holds_altitude() -> None:
    sim = make(n=2)
    hover = sim.cfg.params.hover_rpm
    sim.state[:, RPM] = hover
    run(sim, torch.full((2, 4), hover), 200)  # 2 s
    assert sim.position_w.abs().max().item() < 1e-4
    assert sim.lin_vel_w.abs().max().item() < 1e-4
    assert sim.cfg.params.hover_action == pytest.approx(0.177, abs=1e-3)
    assert torch.allclose(sim.rpm_cmd_from_action(torch.full((2, 4), sim.cfg.params.hover_action)), sim.state[:, RPM])


def _angular_acc_after_one_step(rpm: list[float]) -> torch.Tensor:
    """Motors held at ``rpm`` (state = command, so no lag) from rest; returns ω after dt / dt."""
    sim = make()
    cmd = torch.tensor([rpm])
    sim.state[:, RPM] = cmd
    sim.step(cmd)
    return sim.ang_vel_b[0] / sim.cfg.dt_s


@pytest.mark.parametrize(
    ("faster", "axis"),
    [((2, 3), 0), ((1, 2), 1), ((1, 3), 2)],  # left M3+M4 -> +x; back M2+M3 -> +y; CW M2+M4 -> +z
)
def test_torque_signs_follow_motor_layout(faster: tuple[int, int], axis: int) -> None:
    p = QuadrotorParams()
    base, high = 14000.0, 15000.0
    rpm = [base] * 4
    for i in faster:
        rpm[i] = high
    alpha = _angular_acc_after_one_step(rpm)
    assert alpha[axis].item() > 0.0
    others = [a for a in range(3) if a != axis]
    assert alpha[others].abs().max().item() < 1e-3 * alpha[axis].item()
    # Magnitude: two rotors carry Δf more; lever arm d for roll/pitch, torque ratio for yaw.
    delta_f = 2.0 * p.thrust_coef_n_per_rpm2 * (high**2 - base**2)
    lever = p.torque_to_thrust_m if axis == 2 else p.arm_length_m / math.sqrt(2.0)
    expected = delta_f * lever / p.inertia_kgm2[axis]
    assert alpha[axis].item() == pytest.approx(expected, rel=1e-3)


def test_yaw_torque_pattern_of_the_crazyflie_mixer() -> None:
    """The firmware's positive yaw command raises M2/M4 and lowers M1/M3 (rotor spin): +z acceleration."""
    base, delta = 14000.0, 800.0
    alpha = _angular_acc_after_one_step([base - delta, base + delta, base - delta, base + delta])
    assert alpha[2].item() > 0.0
    assert alpha[:2].abs().max().item() < 1e-3 * alpha[2].item()
    mirrored = _angular_acc_after_one_step([base + delta, base - delta, base + delta, base - delta])
    assert mirrored[2].item() == pytest.approx(-alpha[2].item(), rel=1e-3)


def test_action_is_a_thrust_command_with_the_firmware_cut() -> None:
    """Command chain: T = (a + 1) / 2 * T_max; below T_min the motor stops; thrust k_f rpm^2 = T at steady state."""
    p = QuadrotorParams()
    sim = make()
    t_max, t_min = p.max_thrust_per_motor_n, p.min_thrust_per_motor_n
    thrust_n = torch.tensor([[t_max, 0.5 * t_max, 1.01 * t_min, 0.99 * t_min]])
    action = 2.0 * thrust_n / t_max - 1.0
    rpm = sim.rpm_cmd_from_action(action)
    steady_thrust_n = p.thrust_coef_n_per_rpm2 * rpm.square()
    assert torch.allclose(steady_thrust_n[0, :3], thrust_n[0, :3], rtol=1e-5)
    assert rpm[0, 3].item() == 0.0
    assert sim.rpm_cmd_from_action(torch.full((1, 4), -1.0)).abs().max().item() == 0.0
    assert torch.equal(sim.rpm_cmd_from_action(torch.full((1, 4), 3.0)), sim.rpm_cmd_from_action(torch.ones(1, 4)))
    # The motor follows the setpoint with the lag: after 10 tau the thrust is the command.
    run(sim, rpm, round(10 * p.motor_tau_s / sim.cfg.dt_s))
    assert torch.allclose(p.thrust_coef_n_per_rpm2 * sim.motor_rpm.square(), steady_thrust_n, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize(
    "bad",
    [
        {"mass_kg": float("nan")},
        {"inertia_kgm2": (1e-5, float("nan"), 1e-5)},
        {"max_thrust_per_motor_n": float("inf")},
        {"min_thrust_per_motor_n": float("nan")},
        {"min_thrust_per_motor_n": 0.2},
        {"max_thrust_per_motor_n": 0.5},
        {"gravity_mps2": float("-inf")},
    ],
)
def test_params_reject_non_finite_and_inconsistent_values(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        QuadrotorParams(**bad)  # type: ignore[arg-type]


def test_motor_lag_reaches_63_percent_at_tau() -> None:
    for tau_s in (0.05, 0.15):
        cfg = QuadrotorCfg(params=QuadrotorParams(motor_tau_s=tau_s), ground_z_m=None)
        sim = make(cfg)
        target = 10000.0
        steps = round(tau_s / cfg.dt_s)
        run(sim, torch.full((1, 4), target), steps)
        assert sim.motor_rpm[0, 0].item() / target == pytest.approx(1.0 - math.exp(-1.0), rel=1e-4)


def test_torque_free_rotation_conserves_energy_and_momentum() -> None:
    params = QuadrotorParams(inertia_kgm2=(1.0e-5, 2.0e-5, 3.0e-5), gravity_mps2=0.0)
    sim = make(QuadrotorCfg(params=params, ground_z_m=None))
    sim.state[:, ANG_VEL] = torch.tensor([3.0, -2.0, 5.0])
    inertia = torch.tensor(params.inertia_kgm2, dtype=torch.float64)

    def invariants() -> tuple[float, float]:
        w_b = sim.ang_vel_b[0].double()
        rot = quat_to_rot(sim.quat_wb).view(3, 3).double()
        energy = 0.5 * float((inertia * w_b.square()).sum())
        momentum_w = rot @ (inertia * w_b)  # conserved in the world frame
        return energy, float(momentum_w.norm())

    e0, l0 = invariants()
    momentum0_w = quat_to_rot(sim.quat_wb).view(3, 3).double() @ (inertia * sim.ang_vel_b[0].double())
    run(sim, torch.zeros(1, 4), 1000)  # 10 s, intermediate-axis tumbling included
    e1, l1 = invariants()
    momentum1_w = quat_to_rot(sim.quat_wb).view(3, 3).double() @ (inertia * sim.ang_vel_b[0].double())
    assert abs(e1 - e0) / e0 < 1e-4
    assert abs(l1 - l0) / l0 < 1e-4
    assert (momentum1_w - momentum0_w).norm().item() / l0 < 1e-3
    assert (sim.ang_vel_b[0] - torch.tensor([3.0, -2.0, 5.0])).abs().max().item() > 0.1  # it did tumble


def test_ballistic_flight_conserves_energy() -> None:
    sim = make()
    sim.state[:, LIN_VEL] = torch.tensor([1.0, -0.5, 4.0])
    g, m = sim.cfg.params.gravity_mps2, sim.cfg.params.mass_kg

    def energy() -> float:
        return 0.5 * m * float(sim.lin_vel_w.square().sum()) + m * g * float(sim.position_w[0, 2])

    e0 = energy()
    run(sim, torch.zeros(1, 4), 100)
    assert abs(energy() - e0) / abs(e0) < 1e-5


def test_quaternion_stays_unit_and_rotation_is_proper() -> None:
    sim = make(n=64, seed=3)
    gen = torch.Generator().manual_seed(1)
    sim.state[:, QUAT] = torch.nn.functional.normalize(torch.randn(64, 4, generator=gen), dim=1)
    sim.state[:, ANG_VEL] = 10.0 * torch.randn(64, 3, generator=gen)
    sim.state[:, RPM] = 12000.0 + 4000.0 * torch.rand(64, 4, generator=gen)
    run(sim, 12000.0 + 4000.0 * torch.rand(64, 4, generator=gen), 300)
    norms = torch.linalg.vector_norm(sim.quat_wb, dim=1)
    assert (norms - 1.0).abs().max().item() < 1e-6
    rot = quat_to_rot(sim.quat_wb).view(64, 3, 3)
    assert (rot @ rot.transpose(1, 2) - torch.eye(3)).abs().max().item() < 1e-5
    assert torch.allclose(torch.linalg.det(rot), torch.ones(64), atol=1e-5)


def test_quat_to_rot_is_body_to_world_row_major() -> None:
    half = math.pi / 4  # 90° about world z: body x (forward) points along world y
    quat = torch.tensor([[math.cos(half), 0.0, 0.0, math.sin(half)]])
    rot = quat_to_rot(quat).view(3, 3)
    assert torch.allclose(rot @ torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)
    assert rot[0, 1].item() == pytest.approx(-1.0, abs=1e-6)  # row-major r01


def test_disturbance_force_and_torque_act_in_their_frames() -> None:
    sim = make()
    half = math.pi / 4
    sim.state[:, QUAT] = torch.tensor([math.cos(half), 0.0, 0.0, math.sin(half)])  # yawed 90°
    sim.force_w[:] = torch.tensor([0.027, 0.0, 0.0])  # 1 m/s^2 along world x
    sim.torque_b[:] = torch.tensor([1.66e-5, 0.0, 0.0])  # 1 rad/s^2 about body x
    run(sim, torch.zeros(1, 4), 1)
    assert sim.lin_vel_w[0, 0].item() == pytest.approx(0.01, rel=1e-4)
    assert sim.ang_vel_b[0, 0].item() == pytest.approx(0.01, rel=1e-3)
    assert abs(sim.ang_vel_b[0, 1].item()) < 1e-6


def test_ground_is_flagged_only_when_modelled() -> None:
    grounded = make(QuadrotorCfg(), n=2)
    grounded.state[:, 2] = torch.tensor([0.5, 0.0])
    run(grounded, torch.zeros(2, 4), 40)  # the first starts 0.5 m up, falls through in 0.4 s
    assert grounded.below_ground().tolist() == [True, True]
    grounded.state[:, 2] = torch.tensor([0.5, -0.01])
    assert grounded.below_ground().tolist() == [False, True]
    assert not make(n=2).below_ground().any()


def test_seeded_determinism() -> None:
    rand = RandomizationCfg(mass_scale=(0.8, 1.2), inertia_scale=(0.7, 1.3))
    cfg = QuadrotorCfg(randomization=rand, ground_z_m=None)
    a, b, c = make(cfg, n=16, seed=7), make(cfg, n=16, seed=7), make(cfg, n=16, seed=8)
    for sim in (a, b, c):
        sim.randomize()
        sim.state[:, RPM] = 15000.0
        run(sim, torch.full((16, 4), 15000.0), 30)
    assert torch.equal(a.param_scales, b.param_scales)
    assert torch.equal(a.state, b.state)
    assert not torch.equal(a.param_scales, c.param_scales)


def test_domain_randomization_only_when_enabled() -> None:
    off = make(QuadrotorCfg(ground_z_m=None), n=32)
    rng_before = off.generator.get_state()
    off.randomize()
    assert torch.equal(off.param_scales, torch.ones(32, 6))
    assert torch.equal(off.generator.get_state(), rng_before)  # no random numbers consumed

    rand = RandomizationCfg(
        mass_scale=(0.9, 1.1), inertia_scale=(0.8, 1.2), thrust_coef_scale=(0.95, 1.05), motor_tau_scale=(0.5, 2.0)
    )
    on = make(QuadrotorCfg(randomization=rand, ground_z_m=None), n=256)
    on.randomize()
    for col, (low, high) in enumerate(rand.ranges()):
        scales = on.param_scales[:, col]
        assert low <= scales.min().item() and scales.max().item() <= high
        assert scales.std().item() > 0.2 * (high - low) / math.sqrt(12.0)
    p = on.cfg.params
    assert torch.allclose(on.mass_kg[:, 0], p.mass_kg * on.param_scales[:, 0])
    expected_hover = torch.sqrt(on.mass_kg * p.gravity_mps2 / (4 * on.thrust_coef))
    assert torch.allclose(on.hover_rpm(), expected_hover)
    # A masked redraw keeps the unmasked rows.
    before = on.param_scales.clone()
    mask = torch.arange(256) < 10
    on.randomize(mask)
    assert torch.equal(on.param_scales[10:], before[10:])
    assert not torch.equal(on.param_scales[:10], before[:10])


def test_randomized_hover_rpm_holds_each_env() -> None:
    rand = RandomizationCfg(mass_scale=(0.7, 1.3), thrust_coef_scale=(0.8, 1.2))
    sim = make(QuadrotorCfg(randomization=rand, ground_z_m=None), n=8)
    sim.randomize()
    hover = sim.hover_rpm().expand(8, 4)
    sim.state[:, RPM] = hover
    run(sim, hover, 100)
    assert sim.position_w.abs().max().item() < 1e-4


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="motor time constant"):
        QuadrotorCfg(params=QuadrotorParams(motor_tau_s=0.002))
    QuadrotorCfg(params=QuadrotorParams(motor_tau_s=0.002), substeps=4)  # substeps fix it
    with pytest.raises(ConfigError, match="mass_kg"):
        QuadrotorParams(mass_kg=0.0)
    with pytest.raises(ConfigError, match="low <= high"):
        RandomizationCfg(mass_scale=(1.2, 0.8))
    with pytest.raises(ConfigError, match="mass_scale must be a finite number"):
        RandomizationCfg(mass_scale=(float("nan"), 1.2))
    assert not dataclasses.replace(RandomizationCfg()).enabled


def test_substeps_converge_to_the_same_trajectory() -> None:
    coarse = make(QuadrotorCfg(ground_z_m=None))
    fine = make(QuadrotorCfg(ground_z_m=None, substeps=4))
    for sim in (coarse, fine):
        sim.state[:, ANG_VEL] = torch.tensor([2.0, -1.0, 0.5])
        run(sim, torch.tensor([[15000.0, 14000.0, 15500.0, 14200.0]]), 50)
    assert torch.allclose(coarse.state[:, POS], fine.state[:, POS], atol=1e-4)
    assert torch.allclose(coarse.state[:, QUAT], fine.state[:, QUAT], atol=1e-4)


def test_rk4_step_is_pure() -> None:
    sim = make(n=4)
    state = sim.state.clone()
    state[:, RPM] = 14000.0
    snapshot = state.clone()
    args = (torch.full((4, 4), 15000.0), *sim.physics_inputs())
    out1 = rk4_step(state, *args, 0.01, 1)
    out2 = rk4_step(state, *args, 0.01, 1)
    assert torch.equal(state, snapshot)
    assert torch.equal(out1, out2)
    assert not torch.equal(out1, state)


@pytest.mark.slow
def test_compiled_step_matches_eager() -> None:
    eager = make(QuadrotorCfg(ground_z_m=None), n=32, seed=1)
    compiled = make(QuadrotorCfg(ground_z_m=None, compile=True), n=32, seed=1)
    gen = torch.Generator().manual_seed(2)
    start = eager.state.clone()
    start[:, QUAT] = torch.nn.functional.normalize(torch.randn(32, 4, generator=gen), dim=1)
    start[:, ANG_VEL] = torch.randn(32, 3, generator=gen)
    start[:, RPM] = 14000.0
    cmd = 12000.0 + 5000.0 * torch.rand(32, 4, generator=gen)
    for sim in (eager, compiled):
        sim.state = start.clone()
        run(sim, cmd, 20)
    assert torch.allclose(eager.state, compiled.state, rtol=1e-4, atol=1e-4)


def test_layout_follows_the_step_kind_on_every_assignment() -> None:
    """Compiled sims keep per-env tensors column-major (one contiguous row per component, what
    the compiled kernel reads without transposes); eager sims row-major. Assigning a tensor of
    the other layout converts it without changing its values."""
    n = 16
    for compile_step, strides in ((True, (1, n)), (False, (17, 1))):
        sim = make(QuadrotorCfg(ground_z_m=None, compile=compile_step), n=n, seed=0)
        row_major = torch.randn(n, 17)
        sim.state = row_major
        assert sim.state.stride() == strides
        assert torch.equal(sim.state, row_major)
        sim.force_w = torch.randn(n, 3).t().contiguous().t()
        assert sim.force_w.stride() == ((1, n) if compile_step else (3, 1))
        scales = 1.0 + 0.1 * torch.rand(n, 6)
        sim.param_scales = scales
        torch.testing.assert_close(sim.mass_kg[:, 0], scales[:, 0] * sim.cfg.params.mass_kg)
        assert sim.derived.inertia.stride() == ((1, n) if compile_step else (3, 1))


@pytest.mark.slow
def test_compiled_step_keeps_column_major_state_without_recompiling() -> None:
    torch._dynamo.reset()
    sim = make(QuadrotorCfg(ground_z_m=None, compile=True), n=24, seed=0)
    sim.state[:, RPM] = sim.cfg.params.hover_rpm
    cmd = torch.full((24, 4), sim.cfg.params.hover_rpm)
    run(sim, cmd, 3)
    assert sim.state.stride() == (1, 24)
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    sim.state = sim.state.contiguous()  # e.g. a task writing a row-major reset
    run(sim, cmd, 3)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_before
