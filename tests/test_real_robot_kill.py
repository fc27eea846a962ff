"""Killing the robot side while the node is armed: the node's answer on the wire is the safe
command, sent at once on the publisher-lost event (not after the stale timeout), and nothing but
the safe command follows it.

Real parts: `embodied sim-robot` in its own process (realtime), the node in this one, Cyclone DDS
on loopback between them, and a third participant reading the command topic. Order and content
are asserted, not time (the timing is in BENCHMARKS.md). The fast suite covers the same logic
in-process (test_real_safety.py: the event step, the woken loop).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from real_support import export_policy, free_domain_id, quad_robot, write_robot_variant

from embodied import registry
from embodied.real import messages
from embodied.real.freshness import PUBLISHER_LOST, STALE_ARRIVAL
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.transports.dds import DdsTransport

CLI = [sys.executable, "-m", "embodied.cli"]


def _wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow  # two processes importing torch: 15-60 s on a loaded 2-core machine
def test_sigterm_to_sim_robot_ends_the_wire_with_the_safe_command(tmp_path: Path) -> None:
    cfg = dataclasses.replace(registry.task_cfg("quad-hover"), setpoint_yaw_range_rad=0.0)
    env = registry.make_env("quad-hover", cfg, 1, "cpu", 0)
    export = export_policy(tmp_path / "export", env.io_spec(), seed=4, bias=0.3)
    env.close()
    # Wide envelope: an untrained policy tumbles; any safe command must come from the kill.
    wide = {k: 1e9 for k in ("pos_err_m", "tilt_rad", "ang_vel_rad_s", "lin_vel_m_s")}
    robot_path = write_robot_variant(tmp_path, quad_robot(), {"safety.envelope_limits": wide})
    robot = load_robot(robot_path)
    safe = np.asarray(robot.safety.safe_command)
    domain = free_domain_id()

    wire: list[tuple[float, np.ndarray]] = []
    lock = threading.Lock()
    watch = DdsTransport(domain_id=domain, loopback=True)

    def on_command(message: Any) -> None:
        with lock:
            wire.append((time.monotonic(), messages.to_vector(message.data)))

    watch.subscribe(robot.command.topic, robot.command.type, "reliable", on_command)
    transport = DdsTransport(domain_id=domain, loopback=True, node_name="embodied_policy")
    node = PolicyNode(transport, robot, PolicyRunner(export))
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    sim_args = ["--robot", str(robot_path), "--loopback", "--domain-id", str(domain), "--realtime", "--seconds", "60"]
    sim = subprocess.Popen(
        [*CLI, "sim-robot", "quad-hover", *sim_args, "--env", "obs_noise_std=[0,0,0,0]"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def armed_commands() -> int:
            with lock:
                return sum(not np.allclose(v, safe) for _, v in wire)

        assert _wait(lambda: armed_commands() >= 30, 60.0), (sim.poll(), node.status())
        sim.send_signal(signal.SIGTERM)
        _out, err = sim.communicate(timeout=30)
        assert sim.returncode == 0, err
        # Every command now comes from the node's reaction; let several periods pass.
        n_at_exit = len(wire)
        assert _wait(lambda: len(wire) >= n_at_exit + 10, 5.0)
    finally:
        if sim.poll() is None:
            sim.kill()
        stop.set()
        loop.join(timeout=5.0)
        transport.close()
        watch.close()

    values = [v for _, v in wire]
    is_safe = [bool(np.allclose(v, safe)) for v in values]
    last_armed = max(i for i, s in enumerate(is_safe) if not s)
    # The robot flew (hover commands), then the safe command, and never a hover command after it.
    assert last_armed > 20 and last_armed < len(values) - 10
    assert all(is_safe[last_armed + 1 :]), "a non-safe command followed the safe command"
    # It was the publisher-lost event that disarmed the node, not the slower stale timeout, and an
    # event step (between periods) sent it.
    assert node.rejections[PUBLISHER_LOST] >= 1, node.rejections
    assert node.rejections[STALE_ARRIVAL] == 0, node.rejections
    assert node.loop.stats.event_steps >= 1
    assert node.transitions["armed->stale"] == 1, node.transitions
