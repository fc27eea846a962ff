"""Killing the robot side while the node is armed: no policy command follows on the wire.

SIGTERM: sim-robot deletes its participant, and the publisher-lost event (not the stale timeout)
sends the safe command; the gap hold (hover thrust) may come first. SIGKILL: nothing tells the
node, so its own clock does: the gap hold after 1.5 periods, then the safe command at the stale
limit. Either way only hold and safe commands follow the policy's last one.

Real parts: `embodied sim-robot` in its own process (realtime), the node in this one, Cyclone DDS
on loopback between them, and a third participant reading the command topic. Order and content
are asserted, not time (the timing is in docs/benchmarks/ros2-dds.md). The fast suite covers the same logic
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
from real_support import export_policy, free_domain_id, quad_robot, wait_until, write_robot_variant

from embodied import registry
from embodied.real import messages
from embodied.real.freshness import INPUT_GAP, PUBLISHER_LOST, STALE_ARRIVAL, STALE_STAMP
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.safety import ActionMap
from embodied.real.transports.dds import DdsTransport

CLI = [sys.executable, "-m", "embodied.cli"]


@pytest.mark.slow  # two processes importing torch: 15-60 s on a loaded 2-core machine
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killing_sim_robot_ends_the_wire_with_hold_then_safe_commands(tmp_path: Path, sig: signal.Signals) -> None:
    cfg = dataclasses.replace(registry.task_cfg("quad-hover"), setpoint_yaw_range_rad=0.0)
    env = registry.make_env("quad-hover", cfg, 1, "cpu", 0)
    export = export_policy(tmp_path / "export", env.io_spec(), seed=4, bias=0.3)
    env.close()
    # Wide envelope: an untrained policy tumbles; any safe command must come from the kill.
    wide = {k: 1e9 for k in ("pos_err_m", "tilt_rad", "ang_vel_rad_s", "lin_vel_m_s")}
    # Stale limits of 2 s: the order hold -> safe stays certain even if this process is starved
    # for a while (the shipped 0.2 s is what bench/deploy_under_load.py measures).
    edits = {"safety.envelope_limits": wide, "inputs.odom.stale_timeout_s": 2.0, "inputs.odom.max_stamp_age_s": 2.0}
    robot_path = write_robot_variant(tmp_path, quad_robot(), edits)
    robot = load_robot(robot_path)
    safe = np.asarray(robot.safety.safe_command)
    io_spec = PolicyRunner(export).io_spec
    hover = ActionMap.from_io_spec(io_spec).to_physical(np.full(io_spec.action_dim, io_spec.extra["hover_action"]))
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

        def policy_commands() -> int:
            with lock:
                return sum(not (np.allclose(v, safe) or np.allclose(v, hover)) for _, v in wire)

        assert wait_until(lambda: policy_commands() >= 30, 60.0), (sim.poll(), node.status())
        sim.send_signal(sig)
        _out, err = sim.communicate(timeout=30)
        assert sim.returncode == (0 if sig == signal.SIGTERM else -signal.SIGKILL), err
        # Every command now comes from the node's reaction: wait until the stale limit has passed
        # (generous bounds: a loaded machine; the timing is in docs/benchmarks/ros2-dds.md).
        assert wait_until(lambda: node.transitions["armed->stale"] + node.transitions["hold->stale"] >= 1, 30.0)
        n_at_stale = len(wire)
        assert wait_until(lambda: len(wire) >= n_at_stale + 5, 5.0)
    finally:
        if sim.poll() is None:
            sim.kill()
        stop.set()
        loop.join(timeout=5.0)
        transport.close()
        watch.close()

    kinds = ["safe" if np.allclose(v, safe) else "hold" if np.allclose(v, hover) else "policy" for _, v in wire]
    last_policy = max(i for i, k in enumerate(kinds) if k == "policy")
    after = kinds[last_policy + 1 :]
    # The robot flew (policy commands), then holds and/or the safe command, never the policy again,
    # and once the safe command went out, nothing else.
    assert last_policy > 20 and "safe" in after, kinds[-40:]
    first_safe = after.index("safe")
    assert set(after[:first_safe]) <= {"hold"} and set(after[first_safe:]) == {"safe"}, after
    assert node.transitions["armed->stale"] + node.transitions["hold->stale"] == 1, node.transitions
    if sig == signal.SIGTERM:
        # The publisher-lost event disarmed the node in an event step, not the slower stale timeout.
        assert node.rejections[PUBLISHER_LOST] >= 1, node.rejections
        assert node.rejections[STALE_ARRIVAL] == 0, node.rejections
        assert node.loop.stats.event_steps >= 1
    else:
        # Nothing on the wire says a killed process left: the node's own clock noticed, the gap
        # hold first (from the watchdog, between periods or on one), the stale limit after it.
        assert after[0] == "hold", after[:5]
        stale = node.rejections[STALE_ARRIVAL] + node.rejections[STALE_STAMP]
        assert node.rejections[INPUT_GAP] >= 1 and stale >= 1, node.rejections
        assert node.transitions["hold->stale"] == 1, node.transitions
