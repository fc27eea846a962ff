"""Node safety behaviour on a deterministic clock: watchdog, re-arm, bad data, e-stop, limits,
and the runner's integrity checks. Messages go through the in-process transport so every
period is exactly reproducible."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from real_support import (
    ARM_JOINTS,
    PERIOD,
    Rig,
    arm_io_spec,
    armed_running_node,
    export_policy,
    joint_state,
    odometry,
    quad_field,
    quad_robot,
    quad_spec,
)

from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.freshness import STALE_ARRIVAL_PERIODS
from embodied.real.runner import PolicyRunner
from embodied.real.safety import SafetyState

SAFE = np.zeros(4)


@pytest.fixture(scope="module")
def quad_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_policy(tmp_path_factory.mktemp("quad"), quad_spec(history=2), seed=1, bias=0.2)


def _sent(command: np.ndarray | None) -> np.ndarray:
    assert command is not None, "no command was published this period"
    return command


def _is_safe(command: np.ndarray | None) -> bool:
    return command is not None and np.array_equal(command, SAFE)


def test_watchdog_safe_after_the_stale_limit_and_rearm_rule(quad_export: Path) -> None:
    rig = Rig(quad_export)
    rearm = rig.robot.safety.rearm_periods
    commands = [rig.period(odometry()) for _ in range(rearm + 5)]
    assert all(_is_safe(c) for c in commands[: rearm - 1])  # start-up: re-arm rule applies too
    assert not any(_is_safe(c) for c in commands[rearm - 1 :])
    assert rig.node.state is SafetyState.ARMED
    # Sensor publisher stops: the policy keeps sampling the newest state until the arrival limit
    # (derived from the rate), then the safe command follows within one period.
    silent = [rig.period(None) for _ in range(STALE_ARRIVAL_PERIODS + 3)]
    first_safe = next(i for i, c in enumerate(silent) if _is_safe(c))
    assert STALE_ARRIVAL_PERIODS - 1 <= first_safe <= STALE_ARRIVAL_PERIODS, first_safe  # float rounding
    assert all(_is_safe(c) for c in silent[first_safe:])
    assert rig.node.state is SafetyState.STALE
    assert int(rig.diagnostics()["rejected.stale_arrival"]) == 1  # published at once on the transition
    rig.node.publish_diagnostics()
    assert int(rig.diagnostics()["rejected.stale_arrival"]) == len(silent) - first_safe
    # Sensor resumes: the safe command is held for rearm-1 good periods, then the policy drives.
    resumed = [rig.period(odometry()) for _ in range(rearm + 3)]
    assert all(_is_safe(c) for c in resumed[: rearm - 1])
    assert not any(_is_safe(c) for c in resumed[rearm - 1 :])
    # One command per period (the trained rate), each what step() returned.
    sent = rig.published()
    assert len(sent) == len(commands) + len(silent) + len(resumed)
    np.testing.assert_allclose(messages.to_vector(sent[-1].data), _sent(resumed[-1]), rtol=1e-6)
    assert sent[-1].layout.dim[0].label == rig.robot.command.layout_label


def test_old_future_and_out_of_order_stamps_are_not_fresh(quad_export: Path, caplog: pytest.LogCaptureFixture) -> None:
    import time

    rig = Rig(quad_export)
    # Arriving now, stamped 10 s ago (a replayed or buffered stream): never fresh.
    assert all(_is_safe(rig.period(odometry(stamp_s=time.time() - 10.0))) for _ in range(20))
    assert rig.node.state is SafetyState.WAITING and rig.node.rejections["stale_stamp"] == 20
    assert "header stamp" in rig.node.reason
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry())
    assert rig.node.state is SafetyState.ARMED
    with caplog.at_level(logging.WARNING, logger="embodied.real.node"):
        for _ in range(3):
            rig.period(odometry(quat_xyzw=(0.0, 0.0, 0.0, 0.0)))
    assert caplog.text.count("armed -> fault") == 1  # logged once per transition, not per period
    rig2 = Rig(quad_export)
    assert _is_safe(rig2.period(odometry(stamp_s=time.time() + 10.0)))
    assert rig2.node.rejections["future_stamp"] == 1
    t = time.time()
    rig2.period(odometry(stamp_s=t))
    rig2.period(odometry(stamp_s=t - 0.05))  # out of order: rejected, the newer one stays
    assert rig2.node.rejections["stamp_out_of_order"] == 1
    zero = odometry()
    zero.header.stamp.sec, zero.header.stamp.nanosec = 0, 0
    rig2.period(zero)
    assert rig2.node.rejections["zero_stamp"] == 1
    other = odometry()
    other.header.frame_id = "map"
    rig2.period(other)
    assert rig2.node.rejections["wrong_frame"] == 1
    rig2.node.publish_diagnostics()
    diag = rig2.diagnostics()
    assert diag["rejected.stamp_out_of_order"] == "1" and diag["rejected.wrong_frame"] == "1"


@pytest.mark.parametrize(
    ("state", "key"),
    [
        ({"pos_w": (5.0, 0.0, 1.0)}, "envelope_pos_err_m"),
        ({"pos_w": (1e6, 0.0, 1.0)}, "envelope_pos_err_m"),
        ({"quat_xyzw": (1.0, 0.0, 0.0, 0.0)}, "envelope_tilt_rad"),  # upside down
        ({"ang_vel_b": (1e4, 0.0, 0.0)}, "envelope_ang_vel_rad_s"),
        ({"lin_vel_b": (0.0, 0.0, 50.0)}, "envelope_lin_vel_m_s"),
    ],
)
def test_states_outside_the_training_envelope_get_the_safe_command(quad_export: Path, state: dict, key: str) -> None:
    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry(pos_w=(0.0, 0.0, 1.0)))
    assert rig.node.state is SafetyState.ARMED
    assert all(_is_safe(rig.period(odometry(**{"pos_w": (0.0, 0.0, 1.0), **state}))) for _ in range(3))
    assert rig.node.state is SafetyState.ENVELOPE
    assert rig.node.rejections[key] == 3


def test_shutdown_and_parameter_change_send_the_safe_command(quad_export: Path) -> None:

    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry())
    assert not _is_safe(rig.period(odometry()))
    rig.node.set_params({"setpoint_w": [0.0, 0.0, 1.2]})
    assert np.array_equal(messages.to_vector(rig.published()[-1].data), SAFE)
    assert rig.node.state is SafetyState.REARMING
    stop = threading.Event()
    stop.set()
    rig.node.run(stop)  # the loop ends at once; its exit path still sends the safe command
    assert np.array_equal(messages.to_vector(rig.published()[-1].data), SAFE)
    state = rig.transport.published["/embodied_policy/state"][-1].data
    assert state.startswith("shutdown")
    # Nothing follows the final safe command (a loop still running when a signal handler shut
    # the node down cannot put a policy command after it).
    count = len(rig.published())
    assert rig.period(odometry()) is None and len(rig.published()) == count


def test_glitch_during_rearm_restarts_the_count(quad_export: Path) -> None:
    rig = Rig(quad_export)
    rearm = rig.robot.safety.rearm_periods
    for _ in range(rearm - 2):
        rig.period(odometry())
    rig.period(odometry(quat_xyzw=(0, 0, 0, 0)))  # one bad sample
    commands = [rig.period(odometry()) for _ in range(rearm)]
    assert all(_is_safe(c) for c in commands[: rearm - 1])
    assert not _is_safe(commands[rearm - 1])


@pytest.mark.parametrize(
    ("bad", "log_match"),
    [
        ({"pos_w": (float("nan"), 0.0, 0.0)}, f"{quad_field('pos_err_h')}: non-finite"),
        ({"quat_xyzw": (0.0, 0.0, 0.0, 0.0)}, "a unit quaternion is expected"),
        ({"quat_xyzw": (0.0, 0.0, 0.0, 10.0)}, "has norm 10"),
        ({"ang_vel_b": (float("inf"), 0.0, 0.0)}, "ang_vel_b: non-finite"),
    ],
)
def test_bad_odometry_commands_safe_logs_once_and_recovers(
    quad_export: Path, caplog: pytest.LogCaptureFixture, bad: dict, log_match: str
) -> None:
    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 2):
        rig.period(odometry())
    with caplog.at_level(logging.WARNING, logger="embodied.real.node"):
        faulty = [rig.period(odometry(**bad)) for _ in range(3)]
    assert all(_is_safe(c) for c in faulty)
    assert rig.node.state is SafetyState.FAULT
    assert log_match in caplog.text and "armed -> fault" in caplog.text
    assert caplog.text.count(log_match) == 1  # the transition is logged once, not every period
    recovered = [rig.period(odometry()) for _ in range(rig.robot.safety.rearm_periods)]
    assert not _is_safe(recovered[-1])
    assert rig.node.rejections["invalid_observation"] == 3


def test_estop_latches_until_released_then_rearms(quad_export: Path) -> None:
    rig = Rig(quad_export)
    rearm = rig.robot.safety.rearm_periods
    for _ in range(rearm + 1):
        rig.period(odometry())
    rig.estop(messages.make("std_msgs/msg/Bool", {"data": True}))
    assert all(_is_safe(rig.period(odometry())) for _ in range(20))
    assert rig.node.state is SafetyState.ESTOP
    rig.estop(messages.make("std_msgs/msg/Bool", {"data": False}))
    after = [rig.period(odometry()) for _ in range(rearm)]
    assert all(_is_safe(c) for c in after[:-1]) and not _is_safe(after[-1])


def test_actions_are_clipped_to_policy_io_limits(tmp_path: Path) -> None:
    spec = quad_spec(history=1)
    motors = dataclasses.replace(spec.action_fields[0], low=-0.5, high=0.25)
    export = export_policy(tmp_path, dataclasses.replace(spec, action_fields=(motors,)), bias=5.0)
    rig = Rig(export)  # the policy saturates at +1 before the safety layer
    commands = [rig.period(odometry()) for _ in range(rig.robot.safety.rearm_periods + 1)]
    np.testing.assert_allclose(_sent(commands[-1]), np.full(4, 0.25 * motors.scale + motors.offset))


def test_rate_limit_ramps_from_the_safe_command(tmp_path: Path) -> None:
    spec = arm_io_spec()
    export = export_policy(tmp_path, spec, bias=3.0, gain=0.0)  # constant action +1 -> 1.5 rad
    rig = Rig(export, robot="ros2_control_arm")
    held = np.array([0.1, -0.2, 0.3, -0.4, 0.5, -0.6])
    js = joint_state(ARM_JOINTS, held, np.zeros(6))
    rearm = rig.robot.safety.rearm_periods
    commands = [rig.period(js) for _ in range(rearm + 3)]
    np.testing.assert_allclose(_sent(commands[0]), held)  # safe command of this robot: hold the joints
    rate_per_s = rig.robot.safety.max_action_rate_per_s
    assert rate_per_s is not None  # this robot's safety config sets a rate limit
    step = rate_per_s * spec.control_period_s  # normalized units per period
    held_norm = held / 1.5
    for k, command in enumerate(commands[rearm - 1 :], start=1):
        np.testing.assert_allclose(_sent(command), (held_norm + k * step) * 1.5, atol=1e-9)


def test_hold_robot_sends_nothing_before_any_joint_state(tmp_path: Path) -> None:
    rig = Rig(export_policy(tmp_path, arm_io_spec()), robot="ros2_control_arm")
    assert rig.period(None) is None
    assert rig.published() == []
    assert rig.node.state is SafetyState.WAITING


def test_wrong_sized_joint_state_keeps_node_up_with_hold(tmp_path: Path) -> None:
    rig = Rig(export_policy(tmp_path, arm_io_spec()), robot="ros2_control_arm")
    short = joint_state(ARM_JOINTS[:4], [0.0] * 4, [0.0] * 4)
    assert rig.period(short) is None  # nothing valid to hold and no valid observation
    assert rig.node.state is SafetyState.FAULT
    assert "lacks name" in rig.node.last_error


def test_runner_rejects_mismatched_hash_and_dims(tmp_path: Path) -> None:
    export = export_policy(tmp_path / "a", quad_spec(history=1))
    data = json.loads((export / "policy_io.json").read_text())
    data["model_sha256"] = "0" * 64
    (export / "policy_io.json").write_text(json.dumps(data))
    with pytest.raises(EmbodiedError, match="different exports"):
        PolicyRunner(export)
    with pytest.raises(EmbodiedError, match=r"no policy\.onnx"):
        PolicyRunner(tmp_path / "nothing")


def test_runner_matches_onnx_policy_and_accepts_run_dir(tmp_path: Path) -> None:
    export_policy(tmp_path / "export", quad_spec(history=1), bias=0.1)
    runner = PolicyRunner(tmp_path)  # a run directory: RUN/export/policy.onnx
    obs = np.linspace(-1, 1, runner.io_spec.obs_dim).astype(np.float32)
    action = runner(obs)
    assert action.shape == (4,) and action.dtype == np.float32
    assert np.all(np.abs(action) <= 1.0)
    assert not np.allclose(action, runner(np.zeros_like(obs)))


def test_hold_keeps_last_valid_joints_when_readings_turn_nan(tmp_path: Path) -> None:
    rig = Rig(export_policy(tmp_path, arm_io_spec()), robot="ros2_control_arm")
    good = np.array([0.3, 0.1, -0.2, 0.0, 0.4, -0.5])
    assert np.allclose(_sent(rig.period(joint_state(ARM_JOINTS, good, np.zeros(6)))), good)
    broken = joint_state(ARM_JOINTS, [float("nan")] * 6, np.zeros(6))
    for _ in range(3):
        np.testing.assert_allclose(_sent(rig.period(broken)), good)
    assert rig.node.state is SafetyState.FAULT


def test_inactive_node_sends_safe_until_activated_and_deactivate_is_immediate(quad_export: Path) -> None:
    rig = Rig(quad_export)
    rig.node.deactivate("test")
    assert all(_is_safe(rig.period(odometry())) for _ in range(20))
    assert rig.node.state is SafetyState.INACTIVE
    rig.node.activate()
    commands = [rig.period(odometry()) for _ in range(rig.robot.safety.rearm_periods + 1)]
    assert _is_safe(commands[0]) and not _is_safe(commands[-1])  # re-arm rule after activation
    n = len(rig.published())
    rig.node.deactivate("lifecycle deactivate")
    assert len(rig.published()) == n + 1 and _is_safe(messages.to_vector(rig.published()[-1].data))
    assert _is_safe(rig.period(odometry())) and rig.node.state is SafetyState.INACTIVE


def test_stamped_echo_carries_the_exact_stamp_of_the_state_answered(quad_export: Path) -> None:
    rig = Rig(quad_export)
    message = odometry()
    message.header.stamp.nanosec = 123_456_789  # a stamp float seconds could not carry exactly
    command = rig.period(message)
    echo = rig.transport.published[rig.transport.resolve(rig.robot.command.stamped_topic)][-1]
    assert (echo.header.stamp.sec, echo.header.stamp.nanosec) == (message.header.stamp.sec, 123_456_789)
    np.testing.assert_allclose(messages.to_vector(echo.position), _sent(command))


def test_publisher_leaving_gives_the_safe_command_next_period(quad_export: Path) -> None:
    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry())
    assert rig.node.state is SafetyState.ARMED
    rig.transport.drop_publishers(rig.robot.inputs["odom"].topic)
    assert _is_safe(rig.period(None)) and rig.node.rejections["publisher_lost"] == 1
    assert _is_safe(rig.period(odometry())) and rig.node.state is SafetyState.REARMING  # re-arm rule


def test_event_step_acts_only_on_trouble(quad_export: Path) -> None:
    """A step between periods (``sampled=False``) never runs the policy: with valid inputs it
    sends nothing; once every publisher left it sends the safe command at once."""
    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry())
    assert rig.node.state is SafetyState.ARMED
    sent, history = len(rig.published()), rig.node.builder.history.vector().copy()
    assert rig.node.step(rig.now + 0.3 * PERIOD, sampled=False) is None
    assert len(rig.published()) == sent and np.array_equal(rig.node.builder.history.vector(), history)
    rig.transport.drop_publishers(rig.robot.inputs["odom"].topic)
    assert _is_safe(rig.node.step(rig.now + 0.5 * PERIOD, sampled=False))
    assert rig.node.state is SafetyState.STALE and len(rig.published()) == sent + 1


def test_publisher_lost_wakes_the_running_loop(quad_export: Path) -> None:
    """On its own clock, the loop answers every publisher leaving with an event step: the safe
    command is the next command on the wire and nothing else follows it (a gap hold may come
    first when this thread is slow to drop the publisher)."""
    with armed_running_node(quad_export, quad_robot()) as (node, transport):
        transport.drop_publishers(node.robot.inputs["odom"].topic)
        time.sleep(10 * PERIOD)
    commands = [messages.to_vector(m.data) for m in transport.published[transport.resolve(node.robot.command.topic)]]
    safe = [bool(np.array_equal(c, SAFE)) for c in commands]
    last_armed = max(i for i, s in enumerate(safe) if not s)
    assert all(safe[last_armed + 1 :]) and len(safe) > last_armed + 1
    assert node.loop.stats.event_steps >= 1 and node.rejections["publisher_lost"] >= 1
    assert node.transitions["armed->stale"] + node.transitions["hold->stale"] == 1
