"""sim-robot lockstep against the node in one process (in-process transport, real threads):
simulation time on /clock drives the node's loop, and every step applies the node's answer to
the very state it followed (matched by stamp)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from real_support import export_policy, quad_robot, write_robot_variant

from embodied import registry
from embodied.real.freshness import SimClock
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.sim_robot import SimRobot
from embodied.real.transports.memory import MemoryTransport


@pytest.fixture
def hover_env() -> object:
    cfg = dataclasses.replace(registry.task_cfg("quad-hover"), obs_noise_std=(0.0, 0.0, 0.0, 0.0))
    env = registry.make_env("quad-hover", cfg, 1, "cpu", 0)
    yield env
    env.close()


def test_lockstep_on_sim_time_answers_every_state(hover_env: object, tmp_path: Path) -> None:
    env = hover_env
    export = export_policy(tmp_path / "export", env.io_spec(), seed=4)  # type: ignore[attr-defined]
    transport = MemoryTransport()
    # An untrained policy spins out of the training envelope; wide limits here, so any safe
    # command could only come from the timing this test is about.
    wide = {k: 1e9 for k in ("pos_err_m", "tilt_rad", "ang_vel_rad_s", "lin_vel_m_s")}
    robot = load_robot(write_robot_variant(tmp_path, quad_robot(), {"safety.envelope_limits": wide}))
    sim_clock = SimClock()
    transport.subscribe(SimClock.TOPIC, SimClock.TYPE, "sensor", sim_clock.on_clock)
    node = PolicyNode(transport, robot, PolicyRunner(export), sim_clock=sim_clock)
    answered: list[int] = []
    transport.subscribe(
        robot.command.stamped_topic,
        "sensor_msgs/msg/JointState",
        "reliable",
        lambda m: answered.append(int(m.header.stamp.sec) * 10**9 + int(m.header.stamp.nanosec)),
    )
    sim = SimRobot(env, robot, transport)
    stop = threading.Event()
    worker = threading.Thread(target=node.run, args=(stop,), daemon=True)
    worker.start()
    try:
        summary = sim.run(episodes=2, seed=3, arm_timeout_s=30.0)
    finally:
        stop.set()
        worker.join(timeout=5.0)
    assert summary.episodes == 2 and summary.missed_commands == 0 and summary.safe_commands == 0
    # One tick per period of simulation time: the node answered each published state exactly once
    # (arming ticks included), never twice, whatever the wall time between steps.
    assert len(answered) == len(set(answered)) >= summary.steps
    assert node.loop.stats.steps <= len(answered) + 1
    assert node.rejections["stale_arrival"] == 0 and node.rejections["stale_stamp"] == 0
