"""Observation assembly from robot configs: frame/unit conversions and validation errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from real_support import ARM_JOINTS, arm_io_spec, joint_state, odometry, quad_field, quad_robot, quad_spec

from embodied.config import ConfigError
from embodied.real.observation import ObservationBuilder, ObservationError, quat_to_rotmat
from embodied.real.robot_config import ROBOTS_DIR, load_robot

POS, ROT, VEL, INT = (quad_field(n) for n in ("pos_err_h", "rot_hb", "lin_vel_h", "pos_err_int_h"))


def _robot_variant(tmp_path: Path, name: str, edit: dict) -> Path:
    base = quad_robot() if name == "crazyflie_sim" else ROBOTS_DIR / f"{name}.yaml"
    data = yaml.safe_load(base.read_text())
    for dotted, value in edit.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / f"{name}_variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_quad_observation_from_odometry_matches_conventions() -> None:
    robot = load_robot(quad_robot(), params={"setpoint_w": [0.0, 0.0, 1.0]})
    builder = ObservationBuilder(robot, quad_spec(history=2))
    yaw = math.pi / 2  # body x points along world y
    q_xyzw = (0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))
    msg = odometry(pos_w=(0.1, 0.2, 1.3), quat_xyzw=q_xyzw, lin_vel_b=(1.0, 0.0, 0.5), ang_vel_b=(0.0, 0.0, 0.7))
    builder.history.push(np.array([0.1, 0.2, 0.3, 0.4]))
    obs = builder.build({"odom": msg})
    assert obs.dtype == np.float32 and obs.shape == (3 + 9 + 3 + 3 + 8,)
    np.testing.assert_allclose(obs[0:3], [0.1, 0.2, 0.3], atol=1e-6)  # position error vs setpoint
    np.testing.assert_allclose(obs[3:12], [0, -1, 0, 1, 0, 0, 0, 0, 1], atol=1e-6)  # R_wb row-major
    np.testing.assert_allclose(obs[12:15], [0.0, 1.0, 0.5], atol=1e-6)  # body forward -> world +y
    np.testing.assert_allclose(obs[15:18], [0.0, 0.0, 0.7], atol=1e-6)
    hover = builder.io_spec.extra["hover_action"]  # the task starts episodes with a hover history
    np.testing.assert_allclose(obs[18:], [0.1, 0.2, 0.3, 0.4] + [hover] * 4, atol=1e-6)  # newest first


def test_field_scale_from_policy_io_is_applied() -> None:
    robot = load_robot(quad_robot())
    spec = quad_spec(history=1, pos_scale=2.0)  # scales pos_err_w
    obs = ObservationBuilder(robot, spec).build({"odom": odometry(pos_w=(0.5, 0.0, 0.0))})
    assert obs[0] == pytest.approx(1.0)


def test_ned_frd_and_degree_conversions(tmp_path: Path) -> None:
    path = _robot_variant(
        tmp_path,
        "crazyflie_sim",
        {
            f"observation.{POS}.ops": ["ned_to_enu"],
            f"observation.{ROT}.ops": [{"quat_to_rotmat": "xyzw"}, "rotmat_ned_frd_to_enu_flu"],
            "observation.ang_vel_b.ops": ["deg_to_rad", "frd_to_flu"],
            f"observation.{VEL}.ops": [],
        },
    )
    builder = ObservationBuilder(load_robot(path), quad_spec(history=1))
    # Level, nose north in NED/FRD == nose along ENU +y: identity NED attitude is a +90 deg yaw in ENU.
    msg = odometry(pos_w=(1.0, 2.0, -3.0), ang_vel_b=(90.0, 0.0, 180.0))
    obs = builder.build({"odom": msg})
    np.testing.assert_allclose(obs[0:3], [2.0, 1.0, 3.0])
    np.testing.assert_allclose(obs[3:12].reshape(3, 3) @ [1, 0, 0], [0, 1, 0], atol=1e-6)
    np.testing.assert_allclose(obs[3:12].reshape(3, 3) @ [0, 0, 1], [0, 0, 1], atol=1e-6)
    np.testing.assert_allclose(obs[15:18], [math.pi / 2, 0.0, -math.pi], atol=1e-6)


def test_joint_states_are_reordered_by_name() -> None:
    robot = load_robot("ros2_control_arm")
    builder = ObservationBuilder(robot, arm_io_spec())
    order = [3, 0, 5, 1, 4, 2]
    names = [ARM_JOINTS[i] for i in order] + ["gripper"]
    pos = [float(i) for i in order] + [9.0]
    vel = [10.0 * i for i in order] + [9.0]
    obs = builder.build({"joints": joint_state(names, pos, vel)})
    np.testing.assert_allclose(obs[0:6], [0, 1, 2, 3, 4, 5])
    np.testing.assert_allclose(obs[6:12], [0, 1, 2, 3, 4, 5])  # velocity x scale 0.1
    np.testing.assert_allclose(obs[12:15], [0.4, 0.0, 0.3], rtol=1e-6)


@pytest.mark.parametrize(
    ("message", "match", "reason"),
    [
        (joint_state(ARM_JOINTS[:5], [0.0] * 5, [0.0] * 5), "lacks name", "invalid_observation"),
        (joint_state(ARM_JOINTS, [0.0] * 6, [0.0] * 4), "6 names but 4 values", "wrong_size"),
        (
            joint_state(ARM_JOINTS, [0.0, float("nan"), 0, 0, 0, 0], [0.0] * 6),
            "joint_pos: non-finite",
            "invalid_observation",
        ),
    ],
)
def test_bad_joint_states_raise_observation_error(message: object, match: str, reason: str) -> None:
    """Each kind is counted under its own reason on /diagnostics (``rejected.<reason>``)."""
    builder = ObservationBuilder(load_robot("ros2_control_arm"), arm_io_spec())
    with pytest.raises(ObservationError, match=match) as info:
        builder.build({"joints": message})
    assert info.value.reason == reason


@pytest.mark.parametrize("quat_xyzw", [(0, 0, 0, 0), (0, 0, 0, 10.0), (0, 0, 0, 0.5), (0, 0, float("nan"), 1.0)])
def test_quaternion_off_unit_norm_is_an_observation_error(quat_xyzw: tuple[float, ...]) -> None:
    """Rejected like NaN, not normalized and flown: a norm of 10 or 0.5 is corrupt data."""
    builder = ObservationBuilder(load_robot(quad_robot()), quad_spec(history=1))
    with pytest.raises(ObservationError, match=r"unit quaternion|not finite"):
        builder.build({"odom": odometry(quat_xyzw=quat_xyzw)})
    builder.build({"odom": odometry(quat_xyzw=(0, 0, 0, 1.004))})  # float32 round-off / filter drift passes
    with pytest.raises(ObservationError, match="no message received yet"):
        builder.build({})


def test_policy_io_and_robot_config_mismatch_names_the_fields() -> None:
    with pytest.raises(ConfigError, match=rf"policy fields without a source: {POS}.*joint_pos"):
        ObservationBuilder(load_robot("ros2_control_arm"), quad_spec())


def test_size_mismatch_and_history_mismatch(tmp_path: Path) -> None:
    path = _robot_variant(tmp_path, "crazyflie_sim", {f"observation.{ROT}.ops": []})
    with pytest.raises(ConfigError, match=rf"{ROT} yields 4 values but policy_io.json declares size 9"):
        ObservationBuilder(load_robot(path), quad_spec())
    with pytest.raises(ConfigError, match="config fields the policy does not take: prev_actions"):
        ObservationBuilder(load_robot(quad_robot()), quad_spec(history=0))
    no_hover = dataclasses.replace(quad_spec(history=1), extra={"action_history": 1})
    with pytest.raises(ConfigError, match=r"names 'hover_action', which policy_io\.json's extra does not hold"):
        ObservationBuilder(load_robot(quad_robot()), no_hover)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({f"observation.{POS}.ops": ["ned_to_enuu"]}, r"unknown op 'ned_to_enuu'.*closest first\): ned_to_enu"),
        ({f"observation.{POS}.path": "pose.pose.positon"}, r"unknown field 'positon'.*position"),
        ({f"observation.{POS}.ops": [{"subtract": "setpoint"}]}, r"unknown parameter 'setpoint'.*setpoint_w"),
        ({f"observation.{POS}.input": "odometry"}, r"unknown input 'odometry'.*odom"),
        ({"inputs.odom.type": "nav_msgs/msg/Odom"}, r"nav_msgs/msg/Odometry"),
        ({"inputs.odom.qos": "best_effort"}, r"sensor"),
        ({"command.topik": "/x"}, r"unknown key 'topik'"),
    ],
)
def test_config_errors_name_file_key_and_closest_choice(tmp_path: Path, edit: dict, match: str) -> None:
    path = _robot_variant(tmp_path, "crazyflie_sim", edit)
    with pytest.raises(ConfigError, match=match) as info:
        ObservationBuilder(load_robot(path), quad_spec())
    assert str(path) in str(info.value)


def test_quat_to_rotmat_is_a_rotation() -> None:
    q = np.array([0.3, -0.5, 0.2, 0.7])
    rot = quat_to_rotmat(q / np.linalg.norm(q))
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    assert np.linalg.det(rot) == pytest.approx(1.0)


# ---------------------------------------------------------------- integrate (quad-hover pos_err_int_w)
def test_integrate_op_follows_the_recurrence_and_resets_with_the_history() -> None:
    spec = quad_spec(history=1, pos_err_integral=True)
    # A small limit, read from policy_io's extra like the others, so the clamp engages here.
    spec = dataclasses.replace(spec, extra=spec.extra | {"pos_err_int_limit_ms": 0.05})
    decay, limit, dt = (spec.extra[k] for k in ("pos_err_int_decay", "pos_err_int_limit_ms", "pos_err_int_dt_s"))
    builder = ObservationBuilder(load_robot(quad_robot(), params={"setpoint_w": [0.0, 0.0, 1.0]}), spec)
    rng = np.random.default_rng(0)
    positions = rng.uniform(-0.5, 0.5, size=(40, 3)) + np.array([0.0, 0.0, 1.0])
    positions[10:] = [0.4, -0.45, 1.3]  # a persistent error long enough to reach the clamp on x, y
    expected = np.zeros(3)
    for k, pos in enumerate(positions):
        obs = builder.build({"odom": odometry(pos_w=pos)})
        if k > 0:  # the first observation after a reset carries zero
            expected = np.clip(decay * expected + dt * (pos - [0.0, 0.0, 1.0]), -limit, limit)
        np.testing.assert_allclose(obs[18:21], expected, atol=1e-6)
        builder.history.push(np.zeros(4))
    assert np.abs(expected).max() == pytest.approx(limit)
    builder.history.reset()  # what the node does whenever it (re-)arms
    assert np.array_equal(builder.build({"odom": odometry(pos_w=(0.3, 0.0, 1.0))})[18:21], np.zeros(3))


def test_integrate_op_matches_the_task_in_closed_loop() -> None:
    """Odometry of the task's own states through crazyflie_sim.yaml gives the task's observation."""
    from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

    # A fixed, non-zero setpoint yaw: the node's heading frame is a parameter of the deployment.
    cfg = QuadHoverCfg(
        pos_err_integral=True,
        action_history=1,
        obs_noise_std=(0.0,) * 4,
        episode_steps=25,
        setpoint_yaw_rad=0.7,
        setpoint_yaw_range_rad=0.0,
        yaw_symmetry=False,  # the node's physical observation, compared entry by entry
    )
    env = QuadHover(cfg, 1, torch.device("cpu"), seed=2)
    params = {"setpoint_w": list(cfg.setpoint_w), "setpoint_yaw_rad": [cfg.setpoint_yaw_rad]}
    builder = ObservationBuilder(load_robot(quad_robot(), params=params), env.io_spec())
    obs_task = env.observe(noise=False)["policy"][0].numpy()
    for _ in range(60):
        if env.episode_step[0] == 0:
            builder.history.reset()
        s = {k: v[0].numpy() for k, v in env.physical_state().items()}
        w, x, y, z = s["quat_wb"]
        lin_vel_b = quat_to_rotmat(s["quat_wb"].astype(np.float64)).T @ s["lin_vel_w"]
        msg = odometry(pos_w=s["position_w"], quat_xyzw=(x, y, z, w), lin_vel_b=lin_vel_b, ang_vel_b=s["ang_vel_b"])
        np.testing.assert_allclose(builder.build({"odom": msg}), obs_task, atol=2e-6)
        action = np.array([env.hover_action + 0.05, env.hover_action, env.hover_action - 0.03, env.hover_action])
        builder.history.push(action)
        obs_task = env.step(torch.from_numpy(action).float()[None])[0]["policy"][0].numpy()
    assert np.abs(obs_task[18:21]).max() > 1e-3


@pytest.mark.parametrize(
    ("ops", "match"),
    [
        (
            [{"integrate": {"decay": "pos_err_int_decy"}}],
            r"unknown parameter or policy_io extra number 'pos_err_int_decy'",
        ),
        ([{"integrate": {"decay": 1.5}}], r"decay: must be in \(0, 1\]"),
        ([{"integrate": {"leak": 0.9}}], r"keys decay, limit, dt_s"),
        ([{"integrate": {"limit": "setpoint_w"}}], r"'setpoint_w' has 3 values"),
    ],
)
def test_integrate_op_config_errors(tmp_path: Path, ops: list, match: str) -> None:
    path = _robot_variant(tmp_path, "crazyflie_sim", {f"observation.{INT}.ops": [{"subtract": "setpoint_w"}, *ops]})
    with pytest.raises(ConfigError, match=match):
        ObservationBuilder(load_robot(path), quad_spec(pos_err_integral=True))


def test_optional_field_is_used_only_when_the_policy_takes_it(tmp_path: Path) -> None:
    assert ObservationBuilder(load_robot(quad_robot()), quad_spec(history=1)).io_spec.obs_dim == 22
    path = _robot_variant(tmp_path, "crazyflie_sim", {f"observation.{INT}.optional": False})
    with pytest.raises(ConfigError, match=f"config fields the policy does not take: {INT}"):
        ObservationBuilder(load_robot(path), quad_spec(history=1))
    hold = {"safety.hold": {"input": "odom", "path": "pose.pose.position", "ops": [{"integrate": {}}]}}
    path = _robot_variant(tmp_path, "crazyflie_sim", {**hold, "safety.safe_command": None})
    data = yaml.safe_load(path.read_text())
    del data["safety"]["safe_command"]
    path.write_text(yaml.safe_dump(data))
    robot = load_robot(path)
    assert robot.safety.hold is not None
    from embodied.real.observation import compile_signal

    with pytest.raises(ConfigError, match="only observation fields"):
        compile_signal(robot, robot.safety.hold, "safety.hold")


def test_shipped_config_builds_the_heading_frame_observation() -> None:
    """crazyflie_sim.yaml as shipped, against the heading-frame interface (the heading frame of docs/conventions.md): with a
    setpoint yaw of 90°, a vehicle east of the setpoint, yawed 90° and flying east sees itself
    ahead in h, level and unrotated, flying forward."""
    from embodied.io_spec import ActionField, IOSpec, ObsField

    spec = IOSpec(
        obs_fields=(
            ObsField("pos_err_h", 3, "m", "heading"),
            ObsField("rot_hb", 9),
            ObsField("lin_vel_h", 3, "m/s", "heading"),
            ObsField("ang_vel_b", 3, "rad/s", "body"),
            ObsField("prev_actions", 4),
        ),
        action_fields=(ActionField("motor_thrust", 4, "N", scale=0.05625, offset=0.05625),),
        control_period_s=0.01,
        extra={"action_history": 1, "hover_action": 0.177},
    )
    robot = load_robot(ROBOTS_DIR / "crazyflie_sim.yaml", params={"setpoint_yaw_rad": [math.pi / 2]})
    builder = ObservationBuilder(robot, spec)
    half = math.sqrt(0.5)
    yawed = (0.0, 0.0, half, half)  # xyzw: 90° about z
    obs = builder.build({"odom": odometry(pos_w=(0.5, 0.0, 1.0), quat_xyzw=yawed, lin_vel_b=(1.0, 0.0, 0.0))})
    # h = world rotated by 90°: world east (+x) is h's -y; the body (yawed 90°) is aligned with h.
    np.testing.assert_allclose(obs[0:3], [0.0, -0.5, 0.0], atol=1e-6)
    np.testing.assert_allclose(obs[3:12], np.eye(3).ravel(), atol=1e-6)
    # Body forward = world +y = h's +x.
    np.testing.assert_allclose(obs[12:15], [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(obs[18:22], 0.177, atol=1e-6)


def test_topic_names_resolve_like_ros2() -> None:
    from embodied.errors import EmbodiedError
    from embodied.real.transports import resolve_topic

    assert resolve_topic("cf/odom") == "/cf/odom"
    assert resolve_topic("cf/odom", "/drone1") == "/drone1/cf/odom"
    assert resolve_topic("cf/odom", "drone1/") == "/drone1/cf/odom"
    assert resolve_topic("/diagnostics", "/drone1") == "/diagnostics"
    assert resolve_topic("~/state", "/drone1", "policy") == "/drone1/policy/state"
    with pytest.raises(EmbodiedError, match="empty token"):
        resolve_topic("cf//odom")


def test_nan_velocity_of_a_joint_without_velocity_interface_is_not_measured(tmp_path: Path) -> None:
    """joint_state_broadcaster publishes NaN velocities for joints without a velocity interface;
    the shipped arm config treats them as not measured (0); per joint, null keeps NaN a fault."""
    vel = [0.5, float("nan"), 0.0, float("nan"), 0.0, 1.0]
    message = joint_state(ARM_JOINTS, [0.0] * 6, vel)
    obs = ObservationBuilder(load_robot("ros2_control_arm"), arm_io_spec()).build({"joints": message})
    np.testing.assert_allclose(obs[6:12], [0.05, 0.0, 0.0, 0.0, 0.0, 0.1])  # velocity x scale 0.1
    per_joint = [0.0, 0.0, 0.0, None, 0.0, 0.0]  # joint_4 has a velocity interface: NaN is a fault
    data = yaml.safe_load((ROBOTS_DIR / "ros2_control_arm.yaml").read_text())
    data["observation"]["joint_vel"]["ops"][-1] = {"fill_nan": per_joint}
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(data))
    builder = ObservationBuilder(load_robot(path), arm_io_spec())
    with pytest.raises(ObservationError, match="joint_vel: non-finite"):
        builder.build({"joints": message})
    vel[3] = 0.2
    obs = builder.build({"joints": joint_state(ARM_JOINTS, [0.0] * 6, vel)})
    np.testing.assert_allclose(obs[6:12], [0.05, 0.0, 0.0, 0.02, 0.0, 0.1])


def test_command_joint_order_must_match_the_held_joints(tmp_path: Path) -> None:
    data = yaml.safe_load((ROBOTS_DIR / "ros2_control_arm.yaml").read_text())
    assert data["command"]["joints"] == list(ARM_JOINTS)
    data["command"]["joints"] = list(reversed(ARM_JOINTS))
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"command\.joints is .*wrong joints"):
        load_robot(path)
