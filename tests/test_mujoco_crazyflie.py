"""The independent MuJoCo Crazyflie: hover equilibrium, rotor spin, thrust-command chain,
disturbances, contact, and the observation assembly against the torch task and the heading frame."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from embodied.errors import EmbodiedError
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.sim.mujoco_crazyflie import (
    CrazyflieParams,
    MujocoCrazyflie,
    Perturbation,
    quat_to_rot,
    thrust_to_rpm_setpoint,
)
from embodied.verify.episodes import ActionDecoder, run_episodes
from embodied.verify.observation import ObservationLayout, rot_z, state_terms

P = CrazyflieParams()
T_MAX = P.max_thrust_per_motor_n


def _sim(n: int = 1, perturbation: Perturbation | None = None, params: CrazyflieParams = P) -> MujocoCrazyflie:
    return MujocoCrazyflie(params, n, 0.01, 2, perturbation)


def _reset(sim: MujocoCrazyflie, rpm: float, quat: tuple[float, ...] = (1, 0, 0, 0), z: float = 1.0, **kw) -> None:
    n = sim.num_envs
    sim.reset(
        np.tile([0.0, 0.0, z], (n, 1)),
        np.tile(quat, (n, 1)),
        np.zeros((n, 3)),
        np.zeros((n, 3)),
        np.full((n, 4), rpm),
        np.random.default_rng(0),
        **kw,
    )


def _hover_rpm(params: CrazyflieParams = P) -> float:
    return math.sqrt(params.hover_thrust_n / params.thrust_coef_n_per_rpm2)


THRUST_ACTION = ActionField("motor_thrust", 4, "N", scale=T_MAX / 2, offset=T_MAX / 2)
"""The action of the command chain: per-motor thrust command in newtons."""


def _spec(fields: dict[str, int], **extra: object) -> IOSpec:
    """A thrust-command interface with the given ``name -> size`` observation fields."""
    obs = tuple(ObsField(name, size) for name, size in fields.items())
    return IOSpec(obs, (THRUST_ACTION,), 0.01, extra=dict(extra))


def _thrust_spec(**extra: object) -> IOSpec:
    """World-frame observation, H = 1, the command chain extras."""
    world = {"pos_err_w": 3, "rot_wb": 9, "lin_vel_w": 3, "ang_vel_b": 3, "prev_actions": 4}
    c2 = {"max_thrust_per_motor_n": T_MAX, "min_thrust_per_motor_n": 0.02, "rotor_spin": [-1, 1, -1, 1]}
    return _spec(world, **c2, **extra)


def test_hover_command_holds_the_vehicle_still() -> None:
    hover_action = 2.0 * P.hover_thrust_n / T_MAX - 1.0  # command chain: ≈ 0.177 for 27 g
    assert hover_action == pytest.approx(0.177, abs=2e-3)
    rpm = ActionDecoder(_thrust_spec(), P, "test")(np.full((1, 4), hover_action))
    assert rpm == pytest.approx(np.full((1, 4), _hover_rpm()), rel=1e-9)
    sim = _sim()
    _reset(sim, _hover_rpm())
    for _ in range(100):
        sim.step(rpm)
    assert np.abs(sim.position_w[0] - [0, 0, 1]).max() < 1e-6
    assert np.abs(sim.qvel[0]).max() < 1e-6
    # 5 % more thrust climbs, a heavier vehicle sinks.
    _reset(sim, _hover_rpm())
    for _ in range(50):
        sim.step(rpm * math.sqrt(1.05))
    assert sim.position_w[0, 2] > 1.01
    heavy = _sim(perturbation=Perturbation(mass_scale=1.3))
    _reset(heavy, _hover_rpm())
    for _ in range(50):
        heavy.step(rpm)
    assert heavy.position_w[0, 2] < 0.95


def test_rotor_spin_gives_the_crazyflie_yaw_sign() -> None:
    """Rotor spin: M2 and M4 spin clockwise (reaction +z): raising them yaws the body positively."""
    base = _hover_rpm()
    for boosted, sign in (((1, 3), 1.0), ((0, 2), -1.0)):
        sim = _sim()
        _reset(sim, base)
        cmd = np.full((1, 4), base)
        cmd[0, list(boosted)] *= 1.1
        for _ in range(10):
            sim.step(cmd)
        wx, wy, wz = sim.ang_vel_b[0]
        assert sign * wz > 0.1, f"boosting motors {boosted} must yaw {'+' if sign > 0 else '-'}z, got {wz}"
        assert abs(wx) < 1e-6 and abs(wy) < 1e-6
    # Right-side motors (M1, M2 at -y) raised: torque (r_y f) about x is negative -> roll rate < 0.
    sim = _sim()
    _reset(sim, base)
    cmd = np.full((1, 4), base)
    cmd[0, [0, 1]] *= 1.05
    for _ in range(5):
        sim.step(cmd)
    assert sim.ang_vel_b[0, 0] < -0.1 and abs(sim.ang_vel_b[0, 2]) < 1e-6
    # The mirrored spin (older convention) turns the other way.
    mirrored = _sim(params=CrazyflieParams(rotor_spin=(1.0, -1.0, 1.0, -1.0)))
    _reset(mirrored, base)
    cmd = np.full((1, 4), base)
    cmd[0, [1, 3]] *= 1.1
    for _ in range(10):
        mirrored.step(cmd)
    assert mirrored.ang_vel_b[0, 2] < -0.1


def test_thrust_command_chain_cut_lag_and_units() -> None:
    cmd = np.array([[0.0, 0.019, 0.021, 0.5]])
    rpm = thrust_to_rpm_setpoint(cmd, P)
    assert rpm[0, 0] == 0.0 and rpm[0, 1] == 0.0, "commands below THRUST_MIN produce no thrust"
    assert rpm[0, 2] == pytest.approx(math.sqrt(0.021 / P.thrust_coef_n_per_rpm2))
    assert rpm[0, 3] == pytest.approx(math.sqrt(T_MAX / P.thrust_coef_n_per_rpm2)), "clamped at T_max"
    # First-order lag: after one time constant the speed covers 1 - 1/e of the step.
    sim = MujocoCrazyflie(P, 1, 0.01, 2)
    _reset(sim, 0.0)
    target = np.full((1, 4), 15000.0)
    for _ in range(5):  # 5 x 10 ms = one 50 ms time constant
        sim.step(target)
    assert sim.motor_rpm[0, 0] == pytest.approx(15000.0 * (1 - math.exp(-1)), rel=1e-9)
    # Legacy exports command rotor speed directly.
    legacy = IOSpec(
        obs_fields=(ObsField("pos_err_w", 3),),
        action_fields=(ActionField("motor_rpm", 4, "rpm", scale=10851.0, offset=10851.0),),
        control_period_s=0.01,
    )
    assert ActionDecoder(legacy, P, "x")(np.zeros((1, 4))) == pytest.approx(np.full((1, 4), 10851.0))
    bad = IOSpec(legacy.obs_fields, (ActionField("pwm", 4, "ratio"),), 0.01)
    with pytest.raises(EmbodiedError, match="'pwm' has units 'ratio'"):
        ActionDecoder(bad, P, "x.json")


def test_disturbances_and_ground_contact() -> None:
    # A world-frame force on a vehicle yawed by 90 deg still pushes along world x.
    yaw90 = (math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4))
    sim = _sim()
    _reset(sim, _hover_rpm(), quat=yaw90, force_w=np.array([[0.01, 0.0, 0.0]]))
    rpm = np.full((1, 4), _hover_rpm())
    for _ in range(10):
        sim.step(rpm)
    assert sim.lin_vel_w[0, 0] == pytest.approx(0.01 / P.mass_kg * 0.1, rel=0.02)
    assert abs(sim.lin_vel_w[0, 1]) < 1e-6
    # A body yaw torque spins the vehicle about z at tau / Izz.
    sim = _sim(perturbation=Perturbation(yaw_torque_nm=1e-5))
    _reset(sim, _hover_rpm())
    for _ in range(10):
        sim.step(rpm)
    assert abs(sim.ang_vel_b[0, 2]) == pytest.approx(1e-5 / P.inertia_kgm2[2] * 0.1, rel=0.02)
    # Motors off from 5 cm: the frame comes to rest on the ground plane (contact), not through it.
    sim = _sim()
    _reset(sim, 0.0, z=0.05)
    for _ in range(100):
        sim.step(np.zeros((1, 4)))
    assert 0.012 < sim.position_w[0, 2] < 0.018  # the frame's 15 mm half-height, small penetration
    assert abs(sim.lin_vel_w[0, 2]) < 1e-2


def _random_state(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    quat = rng.normal(size=(n, 4))
    return {
        "position_w": rng.uniform(-0.3, 0.3, (n, 3)) + np.array([0.0, 0.0, 1.0]),
        "quat_wb": quat / np.linalg.norm(quat, axis=1, keepdims=True),
        "lin_vel_w": rng.normal(size=(n, 3)),
        "ang_vel_b": rng.normal(size=(n, 3)),
    }


def _f32(array: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(array, dtype=torch.float32)


def test_observation_assembly_equals_the_torch_task() -> None:
    """Heading-frame fields for random setpoint yaws, with the position-error integral and two
    actions of history."""
    from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

    n = 8
    task = QuadHover(
        QuadHoverCfg(pos_err_integral=True, action_history=2, yaw_symmetry=False), n, torch.device("cpu"), seed=0
    )
    state = _random_state(n, 1)
    history = np.random.default_rng(2).uniform(-1, 1, (n, 8))
    integral = np.random.default_rng(3).uniform(-0.4, 0.4, (n, 3))
    yaw_sp_rad = np.random.default_rng(4).uniform(-np.pi, np.pi, n)
    want = task.set_physical_state(
        position_w=_f32(state["position_w"]),
        quat_wb=_f32(state["quat_wb"]),
        lin_vel_w=_f32(state["lin_vel_w"]),
        ang_vel_b=_f32(state["ang_vel_b"]),
        action_hist=_f32(history),
        pos_err_int_h=_f32(integral),
        yaw_sp_rad=_f32(yaw_sp_rad),
    )["policy"].numpy()
    sim = _sim(n)
    sim.reset(**state, motor_rpm=np.zeros((n, 4)), rng=np.random.default_rng(0))
    layout = ObservationLayout(task.io_spec(), "task")
    terms = state_terms(
        sim.position_w - np.asarray(task.cfg.setpoint_w),
        quat_to_rot(sim.quat_wb),
        sim.lin_vel_w,
        sim.ang_vel_b,
        yaw_sp_rad,
    )
    got = layout.assemble(terms, integral, history, rng=None)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-6)
    # The integral rule from policy_io.json matches the task's (decay, dt, clamp).
    rule = layout.integral_rule
    assert (rule.decay, rule.dt_s, rule.limit_ms) == (0.995, 0.01, 0.5)


def _heading_spec() -> IOSpec:
    """Heading-frame observation with the integral and H = 2."""
    fields = {"pos_err_h": 3, "rot_hb": 9, "lin_vel_h": 3, "ang_vel_b": 3, "pos_err_int_h": 3, "prev_actions": 8}
    return _spec(fields, heading_frame="setpoint_yaw", action_history=2)


def test_heading_frame_observation_is_invariant_to_a_common_yaw() -> None:
    """Heading frame: rotating the vehicle and the setpoint heading together leaves the observation unchanged."""
    n = 6
    layout = ObservationLayout(_heading_spec(), "synthetic policy_io.json")
    assert layout.heading_frame and layout.integral_source == "pos_err_h"
    s = _random_state(n, 4)
    rot_wb = quat_to_rot(s["quat_wb"])
    pos_err_w = s["position_w"] - [0.0, 0.0, 1.0]
    yaw = np.random.default_rng(5).uniform(-math.pi, math.pi, n)
    r = rot_z(yaw)
    base = state_terms(pos_err_w, rot_wb, s["lin_vel_w"], s["ang_vel_b"], np.zeros(n))
    turned = state_terms(
        np.einsum("nij,nj->ni", r, pos_err_w),
        np.matmul(r, rot_wb),
        np.einsum("nij,nj->ni", r, s["lin_vel_w"]),
        s["ang_vel_b"],
        yaw,
    )
    integral, hist = np.zeros((n, 3)), np.zeros((n, 8))
    np.testing.assert_allclose(
        layout.assemble(turned, integral, hist, None), layout.assemble(base, integral, hist, None), atol=1e-6
    )
    # A concrete case: setpoint heading +90 deg, vehicle 1 m along world +x -> 1 m to the heading frame's right.
    one = state_terms(
        np.array([[1.0, 0, 0]]), np.eye(3)[None], np.zeros((1, 3)), np.zeros((1, 3)), np.array([math.pi / 2])
    )
    np.testing.assert_allclose(one["pos_err_h"], [[0.0, -1.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(one["rot_hb"].reshape(3, 3), rot_z(np.array([-math.pi / 2]))[0], atol=1e-12)


def test_unknown_or_missized_fields_are_named() -> None:
    spec = _heading_spec()
    odd = IOSpec((*spec.obs_fields, ObsField("wind_w", 3)), spec.action_fields, 0.01)
    with pytest.raises(EmbodiedError, match=r"unknown obs field 'wind_w'.*pos_err_h"):
        ObservationLayout(odd, "odd.json")
    short = IOSpec((ObsField("rot_hb", 4),), spec.action_fields, 0.01)
    with pytest.raises(EmbodiedError, match=r"short\.json: obs field 'rot_hb' has size 4, expected 9"):
        ObservationLayout(short, "short.json")


def _task_cfg(**kw: object) -> dict[str, object]:
    base = {"episode_steps": 60, "init_level_fraction": 1.0, "disturbance_force_std_n": 0.0}
    return base | {"disturbance_torque_std_nm": 0.0} | kw


def test_episodes_score_like_the_task() -> None:
    """A constant hover command keeps level starts at the setpoint (all succeed); motors off fall
    out of the box (none succeed, episodes end early); a hover command from tilted starts fails."""
    hover = 2.0 * P.hover_thrust_n / T_MAX - 1.0
    spec = _thrust_spec(task_cfg=_task_cfg())
    ok = run_episodes(lambda obs: np.full((obs.shape[0], 4), hover), spec, 16, seed=0, noise=False)
    assert ok.success_rate == 1.0 and ok.mean_episode_length == 60
    off = run_episodes(lambda obs: -np.ones((obs.shape[0], 4)), spec, 16, seed=0, record=2)
    assert off.success_rate == 0.0 and off.mean_episode_length < 60
    assert np.isnan(off.trajectories[:, -1]).all() and np.isfinite(off.trajectories[:, 0]).all()
    tilted = _thrust_spec(task_cfg=_task_cfg(init_level_fraction=0.0))
    drift = run_episodes(lambda obs: np.full((obs.shape[0], 4), hover), tilted, 16, seed=0)
    assert drift.success_rate < 0.5
    # The heading-frame rules draw any setpoint yaw; the observation in h stays the same at rest.
    seen: list[np.ndarray] = []

    def record(obs: np.ndarray) -> np.ndarray:
        seen.append(obs)
        return np.full((obs.shape[0], 4), hover)

    heading = IOSpec(
        _heading_spec().obs_fields,
        spec.action_fields,
        0.01,
        extra={"heading_frame": "setpoint_yaw", "task_cfg": _task_cfg(episode_steps=3), "prev_actions_at_reset": hover},
    )
    result = run_episodes(record, heading, 8, seed=1, noise=False)
    assert result.success_rate == 1.0  # success asks for level and close, any heading
    first = seen[0]
    rot_hb = first[:, 3:12].reshape(-1, 3, 3)
    yaw_h = np.arctan2(rot_hb[:, 1, 0], rot_hb[:, 0, 0])
    assert np.ptp(yaw_h) > 1.0, "initial headings relative to the setpoint must spread over ±180°"


def test_blown_up_envs_are_flagged_and_frozen() -> None:
    """MuJoCo silently resets an env whose velocities blow up (to a vehicle at rest, which would
    score as a hover); the simulator flags it instead, and frozen envs stay where they ended."""
    sim = _sim(2)
    _reset(sim, _hover_rpm())
    sim._state[0, 11] = 1e12  # body rate far beyond MuJoCo's mjMAXVAL
    sim.step(np.full((2, 4), _hover_rpm()))
    assert sim.diverged.tolist() == [True, False]
    sim.freeze(np.array([False, True]))
    before = sim.position_w.copy()
    for _ in range(5):
        sim.step(np.zeros((2, 4)))
    np.testing.assert_array_equal(sim.position_w, before)
