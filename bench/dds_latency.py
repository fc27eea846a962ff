"""Latency of the deployment node over Cyclone DDS on loopback: odometry message -> command message.

Two processes: `embodied deploy` (Cyclone DDS pinned to lo, the shipped crazyflie_sim config)
runs a policy with the quad-hover interface (64x64 tanh MLP, random weights: latency does not
depend on the weights); this script publishes stamped nav_msgs/Odometry and times until the
node's answer to that very message arrives (the stamped command echo, matched by stamp;
ping-pong, one message in flight). The node runs on its own clock at the policy's rate and
samples inputs, so the figure includes the wait for the next control period (uniform in
[0, period) for unsynchronized sensors) on top of transport and compute.

    .venv/bin/python bench/dds_latency.py [--messages 2000] [--repeats 3]

Prints p50/p90/p99 in milliseconds per repeat and their medians, plus the node's own
arrival->publish latency. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.export.onnx import export_onnx
from embodied.export.policy_io import write_policy_io
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.policies.mlp import ExportedPolicy, mlp
from embodied.real import messages
from embodied.real.robot_config import load_robot
from embodied.real.transports.dds import DdsTransport

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def quad_interface(history: int = 32) -> IOSpec:
    """The quad-hover layout of docs/conventions.md (the task's own spec when it is importable)."""
    try:
        from embodied import registry

        env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 1, "cpu", 0)
        spec: IOSpec = env.io_spec()
        env.close()
        return spec
    except Exception:  # the bench measures transport + node: a hand-written layout is as good
        return IOSpec(
            obs_fields=(
                ObsField("pos_err_w", 3), ObsField("rot_wb", 9), ObsField("lin_vel_w", 3),
                ObsField("ang_vel_b", 3), ObsField("prev_actions", 4 * history),
            ),
            action_fields=(ActionField("motor_rpm", 4, "rpm", scale=10851.0, offset=10851.0),),
            control_period_s=0.01,
            extra={"action_history": history},
        )  # fmt: skip


def make_export(out: Path) -> Path:
    spec = quad_interface()
    torch.manual_seed(0)
    net = mlp(spec.obs_dim, [64, 64], spec.action_dim, act="tanh")
    with torch.no_grad():
        net[-1].bias.fill_(0.3)  # far from the safe command (motors off), so arming is visible
    module = ExportedPolicy.from_normalizer(net, None, spec.obs_dim)
    result = export_onnx(module, spec, out)
    write_policy_io(out, spec, result.model_sha256, source_run="bench")
    return out


def odometry(stamp_ns: int) -> Any:
    return messages.make(
        "nav_msgs/msg/Odometry",
        {
            "header": {"frame_id": "world", "stamp": {"sec": stamp_ns // 10**9, "nanosec": stamp_ns % 10**9}},
            "pose": {"pose": {"position": {"z": 1.0}, "orientation": {"w": 1.0}}},
        },
    )


def measure(export: Path, count: int, domain: int) -> dict[str, Any]:
    from real_support import quad_robot

    robot_path = str(quad_robot())
    robot = load_robot(robot_path)
    node = subprocess.Popen(
        [sys.executable, "-m", "embodied.cli", "deploy", str(export), "--robot", robot_path, "--transport", "dds",
         "--loopback", "--domain-id", str(domain), "--no-live", "--duration", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    transport = DdsTransport(domain, loopback=True)
    got = threading.Event()
    received: list[np.ndarray] = []
    wanted = [0]

    def on_answer(m: Any) -> None:
        if int(m.header.stamp.sec) * 10**9 + int(m.header.stamp.nanosec) == wanted[0]:
            received.append(messages.to_vector(m.position))
            got.set()

    odom = robot.inputs["odom"]
    transport.subscribe(robot.command.stamped_topic, "sensor_msgs/msg/JointState", robot.command.qos, on_answer)
    publish = transport.publisher(odom.topic, odom.type, "reliable")
    try:
        if not transport.wait_for_subscribers(publish, timeout_s=60.0):
            raise RuntimeError("deploy process never subscribed")
        deadline = time.monotonic() + 30.0
        while not (received and np.any(received[-1] > 0)):  # until armed (motors-off is the safe command)
            if time.monotonic() > deadline:
                raise RuntimeError("node never armed")
            wanted[0] = time.time_ns()
            publish(odometry(wanted[0]))
            time.sleep(0.005)
        time.sleep(0.05)
        latencies = []
        for _ in range(count):
            got.clear()
            wanted[0] = time.time_ns()
            message = odometry(wanted[0])
            t0 = time.perf_counter()
            publish(message)
            if got.wait(1.0):
                latencies.append(time.perf_counter() - t0)
            time.sleep(0.001)
        p = np.percentile(np.asarray(latencies), [50, 90, 99]) * 1e3
        return {"answered": len(latencies), "sent": count, "p50_ms": p[0], "p90_ms": p[1], "p99_ms": p[2]}
    finally:
        transport.close()
        node.terminate()
        out, _ = node.communicate(timeout=10)
        tail = [line for line in out.splitlines() if "latency" in line]
        if tail:
            print(f"  node: {tail[-1].strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export = make_export(Path(tmp) / "export")
        runs = []
        for i in range(args.repeats):
            result = measure(export, args.messages, random.randrange(100, 230))
            print(
                f"repeat {i}: " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()})
            )
            runs.append(result)
    summary = {k: float(np.median([r[k] for r in runs])) for k in ("p50_ms", "p90_ms", "p99_ms")}
    print("median over repeats (obs message -> command message, loopback DDS): " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
