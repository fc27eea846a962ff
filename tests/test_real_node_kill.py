"""Killing the deployment node mid-flight: the robot side goes safe without it.

SIGKILL: the node sends nothing more, so the robot's command watchdog must act: sim-robot (the
robot side, realtime, in this process) applies the safe command once no command arrived for
``command.watchdog_periods`` periods, and a stock-driver-style reader that requested the node's
offered DEADLINE is told by Cyclone DDS. SIGTERM: the node's final safe command, written reliably
and acknowledged before its participant goes, is the last command an independent reader (this
process, not the node's) sees.

Real parts: `embodied deploy` in its own process (no torch), Cyclone DDS on loopback, the
quad-hover simulator behind sim-robot's topics. Order and content are asserted, not time.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from real_support import export_policy, free_domain_id, quad_robot, wait_until, write_robot_variant

from embodied import registry
from embodied.real import messages
from embodied.real.robot_config import load_robot
from embodied.real.sim_robot import SimRobot
from embodied.real.transports.dds import DdsTransport, idl_struct

WATCHDOG_PERIODS = 5


@pytest.mark.slow  # the node in its own process, a realtime flight: 10-30 s on a loaded 2-core machine
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_node_killed_mid_flight_leaves_the_robot_safe(tmp_path: Path, sig: signal.Signals) -> None:
    from cyclonedds.core import Policy, Qos
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic

    cfg = dataclasses.replace(
        registry.task_cfg("quad-hover"), setpoint_yaw_range_rad=0.0, obs_noise_std=(0.0, 0.0, 0.0, 0.0)
    )
    env = registry.make_env("quad-hover", cfg, 1, "cpu", 0)
    export = export_policy(tmp_path / "export", env.io_spec(), seed=4, bias=0.3)
    # Wide envelope: an untrained policy tumbles; any safe command must come from the kill.
    wide = {k: 1e9 for k in ("pos_err_m", "tilt_rad", "ang_vel_rad_s", "lin_vel_m_s")}
    robot_path = write_robot_variant(
        tmp_path, quad_robot(), {"safety.envelope_limits": wide, "command.watchdog_periods": WATCHDOG_PERIODS}
    )
    robot = load_robot(robot_path)
    safe = np.asarray(robot.safety.safe_command)
    domain = free_domain_id()
    transport = DdsTransport(domain_id=domain, loopback=True, node_name="embodied_sim_robot")
    sim = SimRobot(env, robot, transport, "quad-hover")
    wire: list[tuple[int, np.ndarray]] = []
    lock = threading.Lock()

    def on_command(message: Any) -> None:
        with lock:
            wire.append((int(message.sample_info.source_timestamp), messages.to_vector(message.data)))

    watch = DdsTransport(domain_id=domain, loopback=True)
    watch.subscribe(robot.command.topic, robot.command.type, "reliable", on_command)
    # A driver requesting the node's offered deadline (watchdog_periods x the control period).
    period_s = float(env.dt)
    participant = DomainParticipant(domain)
    topic = Topic(participant, messages.dds_topic_name("/" + robot.command.topic), idl_struct(robot.command.type))
    deadline_qos = Qos(Policy.Reliability.Reliable(0), Policy.Deadline(round(WATCHDOG_PERIODS * period_s * 1e9)))
    driver = DataReader(participant, topic, qos=deadline_qos)
    applied: list[np.ndarray] = []
    summary: list[Any] = []
    flight = threading.Thread(
        target=lambda: summary.append(
            sim.run(seconds=120.0, realtime=True, arm_timeout_s=90.0, on_step=lambda _o, a: applied.append(a.copy()))
        ),
        daemon=True,
    )
    node_args = [str(export), "--robot", str(robot_path), "--loopback", "--domain-id", str(domain), "--no-live"]
    # Its output goes to a file: a pipe nobody reads while it flies would block it once full.
    node_log_path = tmp_path / "node.log"
    node_log = node_log_path.open("w")
    node = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "embodied.commands.deploy", *node_args, "--rt-priority", "0"],
        stdout=node_log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    flight.start()
    try:

        def policy_commands() -> int:
            with lock:
                return sum(not np.allclose(v, safe) for _, v in wire)

        assert wait_until(lambda: policy_commands() >= 30, 90.0), node.poll()
        # The offered deadline is compatible: the node's writer matched and none was refused for its
        # QoS. At least one, not exactly one: another process's participant can share the domain.
        assert driver.get_subscription_matched_status().current_count >= 1
        assert driver.get_requested_incompatible_qos_status().total_count == 0
        steps_at_kill = len(applied)
        t_signal = time.time_ns()
        node.send_signal(sig)
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack into the log
            node.wait(timeout=10)
            pytest.fail("the node did not exit within 30 s of the signal:\n" + node_log_path.read_text())
        # the robot side runs on: past the watchdog (or the final command), then ends the session
        assert wait_until(lambda: len(applied) > steps_at_kill + 4 * WATCHDOG_PERIODS, 30.0)
        time.sleep(0.2)
    finally:
        if node.poll() is None:
            node.kill()
        sim.halt()
        flight.join(timeout=10.0)
        transport.close()
        watch.close()
        node_log.close()
    node_output = node_log_path.read_text()
    if "most recent call first" in node_output:  # its exit guard ended a hung teardown: say where
        warnings.warn("the node's teardown hung; its exit guard ended it:\n" + node_output, stacklevel=1)
    else:
        assert node.returncode == (0 if sig == signal.SIGTERM else -signal.SIGKILL), node_output
    (result,) = summary
    normalized_safe = sim.actions.to_normalized(safe)
    is_safe = [bool(np.allclose(a, normalized_safe)) for a in applied]
    assert not any(is_safe[: steps_at_kill - 1])  # it flew on the policy until the signal
    assert is_safe[-1] and result.safe_at_end
    first_safe = is_safe.index(True)
    assert all(is_safe[first_safe:])  # once safe, nothing else was applied
    with lock:
        after = [v for ts, v in sorted(wire, key=lambda e: e[0]) if ts >= t_signal]
    if sig == signal.SIGKILL:
        # nothing came from the node: the robot's watchdog did it, after the configured silence
        assert all(not np.allclose(v, safe) for v in after)
        assert result.watchdog_trips == 1 and result.watchdog_periods[0] >= WATCHDOG_PERIODS
        assert driver.get_requested_deadline_missed_status().total_count >= 1  # the driver was told too
    else:
        # the node's last word: the safe command, seen by this independent reader, applied by the robot
        assert after and np.allclose(after[-1], safe)
        assert result.watchdog_trips == 0
