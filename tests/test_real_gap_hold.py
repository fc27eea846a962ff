"""Short input gaps: the hold command without disarming, then the safe command at the stale limit.

The shipped crazyflie_sim.yaml bridges an odometry gap of 1.5 periods with hover thrust on every
motor (``safety.gap_hold``); the next message lets the policy drive again at once, and only the
stale limit cuts the motors. On its own clock the loop checks for a gap between periods too (its
watchdog), so a robot that stops publishing without leaving (a crash) is answered without waiting
for the next period or the middleware.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from real_support import (
    PERIOD,
    Rig,
    armed_running_node,
    export_policy,
    odometry,
    quad_robot,
    quad_spec,
    write_robot_variant,
)

from embodied.config import ConfigError
from embodied.real import messages
from embodied.real.freshness import INPUT_GAP, STALE_ARRIVAL, STALE_ARRIVAL_PERIODS
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.safety import ActionMap, SafetyState
from embodied.real.transports.memory import MemoryTransport

SAFE = np.zeros(4)


@pytest.fixture(scope="module")
def quad_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_policy(tmp_path_factory.mktemp("quad"), quad_spec(history=2), seed=1, bias=0.2)


def _hover(export: Path) -> np.ndarray:
    """The shipped gap command: the normalized hover action on every motor, in newtons."""
    spec = PolicyRunner(export).io_spec
    return ActionMap.from_io_spec(spec).to_physical(np.full(spec.action_dim, float(spec.extra["hover_action"])))


def _kind(command: np.ndarray | None, hover: np.ndarray) -> str:
    """``safe`` (motors off), ``hover`` (the gap hold) or ``policy``; a period must send one."""
    assert command is not None, "no command was published this period"
    return "safe" if np.allclose(command, SAFE) else "hover" if np.allclose(command, hover) else "policy"


def _arm(rig: Rig) -> None:
    for _ in range(rig.robot.safety.rearm_periods + 1):
        rig.period(odometry())
    assert rig.node.state is SafetyState.ARMED


def test_a_gap_holds_hover_then_the_policy_drives_again_without_rearming(quad_export: Path) -> None:
    rig = Rig(quad_export)
    hover = _hover(quad_export)
    _arm(rig)
    # One period without a message is sampled data (the newest state), not a gap.
    late = rig.period(None)
    assert late is not None and not np.allclose(late, hover) and rig.node.state is SafetyState.ARMED
    history_before = rig.node.builder.history.vector().copy()
    held = rig.period(None)  # 2 periods since the last message: beyond 1.5
    assert held is not None and np.allclose(held, hover) and not np.allclose(held, SAFE)
    assert rig.node.state is SafetyState.HOLD and rig.node.rejections[INPUT_GAP] == 1
    # The hold is this period's action: the history advanced by it (newest first).
    history = rig.node.builder.history.vector()
    assert not np.array_equal(history, history_before)
    np.testing.assert_allclose(history[:4], ActionMap.from_io_spec(rig.node.io_spec).to_normalized(hover))
    resumed = rig.period(odometry())
    assert rig.node.state is SafetyState.ARMED  # at once: no re-arm rule after a gap
    assert resumed is not None and not np.allclose(resumed, hover) and not np.allclose(resumed, SAFE)
    assert rig.node.transitions["armed->hold"] == 1 and rig.node.transitions["hold->armed"] == 1
    assert rig.node.transitions["hold->stale"] == 0


def test_a_long_gap_escalates_to_the_safe_command_at_the_stale_limit(quad_export: Path) -> None:
    rig = Rig(quad_export)
    hover = _hover(quad_export)
    _arm(rig)
    silent = [rig.period(None) for _ in range(STALE_ARRIVAL_PERIODS + 3)]
    kinds = [_kind(c, hover) for c in silent]
    first_hover, first_safe = kinds.index("hover"), kinds.index("safe")
    assert first_hover == 1  # the second silent period
    assert set(kinds[:first_hover]) == {"policy"} and set(kinds[first_hover:first_safe]) == {"hover"}
    assert set(kinds[first_safe:]) == {"safe"} and STALE_ARRIVAL_PERIODS - 1 <= first_safe <= STALE_ARRIVAL_PERIODS
    assert rig.node.state is SafetyState.STALE and rig.node.transitions["hold->stale"] == 1
    assert rig.node.rejections[STALE_ARRIVAL] >= 1
    # Back from stale: the re-arm rule applies again (safe command for rearm - 1 good periods).
    resumed = [rig.period(odometry()) for _ in range(rig.robot.safety.rearm_periods)]
    assert all(_kind(c, hover) == "safe" for c in resumed[:-1])


def test_without_gap_hold_the_node_samples_until_the_stale_limit(quad_export: Path, tmp_path: Path) -> None:
    rig = Rig(quad_export, write_robot_variant(tmp_path, quad_robot(), {"safety.gap_hold": None}))
    hover = _hover(quad_export)
    _arm(rig)
    silent = [rig.period(None) for _ in range(5)]
    assert all(_kind(c, hover) == "policy" for c in silent)
    assert rig.node.state is SafetyState.ARMED


def test_the_running_loop_holds_when_the_sensor_stops(quad_export: Path, tmp_path: Path) -> None:
    """A sensor that stops without leaving (no publisher-lost event): the next command after the
    policy's is the hold, then the safe command. Stale limits of 2 s keep the order certain on
    a loaded machine (a loop starved past the limit would skip the hold)."""
    limits = {"inputs.odom.stale_timeout_s": 2.0, "inputs.odom.max_stamp_age_s": 2.0}
    with armed_running_node(quad_export, write_robot_variant(tmp_path, quad_robot(), limits)) as (node, transport):
        # The sensor went silent; wait for the stale limit to pass (generous: a loaded machine).
        deadline = time.monotonic() + 20.0
        while node.state is not SafetyState.STALE and time.monotonic() < deadline:
            time.sleep(PERIOD)
    robot = node.robot
    assert node.state is SafetyState.STALE
    hover = _hover(quad_export)
    commands = [messages.to_vector(m.data) for m in transport.published[transport.resolve(robot.command.topic)]]
    kinds = [_kind(c, hover) for c in commands]
    last_policy = max(i for i, k in enumerate(kinds) if k == "policy")
    after = kinds[last_policy + 1 :]
    assert after[0] == "hover" and "safe" in after
    assert set(after[: after.index("safe")]) == {"hover"} and set(after[after.index("safe") :]) == {"safe"}
    assert node.transitions["armed->hold"] >= 1 and node.transitions["hold->stale"] == 1


@pytest.mark.parametrize(
    ("gap_hold", "expected"),
    [
        ({"command": [1.0, 2.0]}, "safety.gap_hold.command has 2 values"),
        ({"command": "no_such_number"}, "safety.gap_hold.command names 'no_such_number'"),
        ({"inputs": ["imu"]}, "safety.gap_hold.inputs"),
        ({"after_periods": 0}, "safety.gap_hold.after_periods"),
        ({"after_period": 2}, "unknown key 'after_period'"),
    ],
)
def test_bad_gap_hold_config_names_the_key(quad_export: Path, tmp_path: Path, gap_hold: dict, expected: str) -> None:
    path = write_robot_variant(tmp_path, quad_robot(), {"safety.gap_hold": gap_hold})
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")):
        PolicyNode(MemoryTransport(), load_robot(path), PolicyRunner(quad_export))
