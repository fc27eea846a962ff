"""Node safety behaviour on a deterministic clock: watchdog, re-arm, bad data, e-stop, limits,
and the runner's integrity checks. Messages go through the in-process transport so every
period is exactly reproducible."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from real_support import ARM_JOINTS, arm_io_spec, export_policy, joint_state, odometry, quad_spec

from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.safety import SafetyState
from embodied.real.transports.memory import MemoryTransport

PERIOD = 0.01
SAFE = np.zeros(4)


class Rig:
    """A node on an in-process transport with a hand-driven clock."""

    def __init__(self, export_dir: Path, robot: str = "crazyflie_sim", trigger: str | None = None) -> None:
        self.now = 0.0
        self.transport = MemoryTransport()
        self.robot = load_robot(robot)
        if trigger is not None:
            self.robot = dataclasses.replace(self.robot, trigger=trigger)
        self.node = PolicyNode(self.transport, self.robot, PolicyRunner(export_dir), clock=lambda: self.now)
        first = next(iter(self.robot.inputs.values()))
        self.sensor = self.transport.publisher(first.topic, first.type, first.qos)
        self.estop = self.transport.publisher(self.robot.safety.estop_topic, "std_msgs/msg/Bool", "reliable")

    def period(self, message: Any | None) -> np.ndarray | None:
        """Advance one control period, optionally delivering ``message`` first; return the command."""
        self.now += PERIOD
        if message is not None:
            self.sensor(message)
        return self.node.step(self.now)

    def published(self) -> list[Any]:
        return self.transport.published[self.robot.command.topic]


@pytest.fixture(scope="module")
def quad_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_policy(tmp_path_factory.mktemp("quad"), quad_spec(history=2), seed=1, bias=0.2)


def _sent(command: np.ndarray | None) -> np.ndarray:
    assert command is not None, "no command was published this period"
    return command


def _is_safe(command: np.ndarray | None) -> bool:
    return command is not None and np.array_equal(command, SAFE)


@pytest.mark.parametrize("trigger", ["input", "timer"])
def test_watchdog_safe_within_two_periods_and_rearm_rule(quad_export: Path, trigger: str) -> None:
    rig = Rig(quad_export, trigger=trigger)
    rearm = rig.robot.safety.rearm_periods
    commands = [rig.period(odometry()) for _ in range(rearm + 5)]
    assert all(_is_safe(c) for c in commands[: rearm - 1])  # start-up: re-arm rule applies too
    assert not any(_is_safe(c) for c in commands[rearm - 1 :])
    assert rig.node.state is SafetyState.ARMED
    # Sensor publisher stops: the first missing message was due one period after the last one.
    silent = [rig.period(None) for _ in range(4)]
    first_safe = next(i for i, c in enumerate(silent) if _is_safe(c))
    assert first_safe + 1 <= 2, f"safe command only {first_safe + 1} periods after the sensor stopped"
    assert all(_is_safe(c) for c in silent[first_safe:])
    assert rig.node.state is SafetyState.STALE
    # Sensor resumes: the safe command is held for rearm-1 good periods, then the policy drives.
    resumed = [rig.period(odometry()) for _ in range(rearm + 3)]
    assert all(_is_safe(c) for c in resumed[: rearm - 1])
    assert not any(_is_safe(c) for c in resumed[rearm - 1 :])
    # Input-triggered: a silent period before the timeout publishes nothing (no new state to
    # answer); on a timer the last observation is answered again. Every published message
    # carries what step() returned.
    unanswered = first_safe if trigger == "input" else 0
    assert sum(c is None for c in silent) == unanswered
    sent = rig.published()
    assert len(sent) == len(commands) + len(silent) - unanswered + len(resumed)
    np.testing.assert_allclose(messages.to_vector(sent[-1].data), _sent(resumed[-1]), rtol=1e-6)
    assert sent[-1].layout.dim[0].label == rig.robot.command.layout_label


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
        (odometry(pos_w=(float("nan"), 0.0, 0.0)), "pos_err_w: non-finite"),
        (odometry(quat_xyzw=(0.0, 0.0, 0.0, 0.0)), "zero norm"),
        (odometry(ang_vel_b=(float("inf"), 0.0, 0.0)), "ang_vel_b: non-finite"),
    ],
)
def test_bad_odometry_commands_safe_logs_and_recovers(
    quad_export: Path, caplog: pytest.LogCaptureFixture, bad: Any, log_match: str
) -> None:
    rig = Rig(quad_export)
    for _ in range(rig.robot.safety.rearm_periods + 2):
        rig.period(odometry())
    with caplog.at_level(logging.ERROR, logger="embodied.real.node"):
        faulty = [rig.period(bad) for _ in range(3)]
    assert all(_is_safe(c) for c in faulty)
    assert rig.node.state is SafetyState.FAULT
    assert log_match in caplog.text and "safe command" in caplog.text
    assert caplog.text.count(log_match) == 1  # repeated identical errors are rate-limited
    recovered = [rig.period(odometry()) for _ in range(rig.robot.safety.rearm_periods)]
    assert not _is_safe(recovered[-1])
    assert rig.node.error_count == 3


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
    step = rig.robot.safety.max_action_rate_per_s * spec.control_period_s  # normalized units per period
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
