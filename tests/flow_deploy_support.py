"""Flies an exported arm-push policy through the deploy node (``PolicyNode``, in-process
transport, hand-driven clock) against the MuJoCo task, beside the same export run directly on
the task's observation. Used by tests/test_flow_deploy.py and for the deploy figures in
BENCHMARKS.md.

Stand-in, and its limit: the messages the node reads (joint states, the fingertip, block and
goal positions, the block velocity) are published here from the task's own observation, as an
arm driver and a block tracker would publish them; no simulator process serves them
(``embodied sim-robot`` publishes quadrotor odometry only).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied import registry
from embodied.real import messages
from embodied.real.node import PolicyNode
from embodied.real.robot_config import ROBOTS_DIR, load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.transports.memory import MemoryTransport

ARM_ROBOT = ROBOTS_DIR / "arm_push_sim.yaml"
JOINTS = ("shoulder", "elbow", "wrist")


@dataclasses.dataclass
class DeployResult:
    episodes: int
    successes: int
    steps: int
    max_action_diff: float
    """Max ``|node action - direct action|`` (normalized units) over every step flown."""
    rejections: int


class ArmPublisher:
    """Publishes one arm-push observation ``[18]`` as the robot config's input messages."""

    def __init__(self, transport: MemoryTransport) -> None:
        robot = load_robot(ARM_ROBOT)
        self.pub = {name: transport.publisher(i.topic, i.type, i.qos) for name, i in robot.inputs.items()}
        self.stamp_ns = 0

    def __call__(self, obs: np.ndarray) -> None:
        o = [float(v) for v in obs]
        # wall-clock stamps, strictly increasing (the node judges stamps against the wall clock)
        self.stamp_ns = max(time.time_ns(), self.stamp_ns + 1)
        sec, nanosec = divmod(self.stamp_ns, 1_000_000_000)

        def header(frame: str) -> dict[str, Any]:
            return {"frame_id": frame, "stamp": {"sec": sec, "nanosec": nanosec}}

        def point(x: float, y: float) -> Any:
            return messages.make(
                "geometry_msgs/msg/PointStamped", {"header": header("base"), "point": {"x": x, "y": y, "z": 0.0}}
            )

        # joints listed in another order than the config's: the node reorders them by name
        order = [2, 0, 1]
        self.pub["joints"](
            messages.make(
                "sensor_msgs/msg/JointState",
                {
                    "header": header("base"),
                    "name": [JOINTS[i] for i in order],
                    "position": np.array([o[i] for i in order]),
                    "velocity": np.array([o[3 + i] for i in order]),
                    "effort": np.zeros(0),
                },
            )
        )
        self.pub["fingertip"](point(o[6], o[7]))
        self.pub["block"](point(o[8], o[9]))
        zero = {"x": 0.0, "y": 0.0, "z": 0.0}
        twist = {"linear": {"x": o[10], "y": o[11], "z": 0.0}, "angular": zero}
        self.pub["block_twist"](
            messages.make("geometry_msgs/msg/TwistStamped", {"header": header("base"), "twist": twist})
        )
        self.pub["goal"](point(o[12], o[13]))


def fly_arm_push(export: Path, episodes: int, seed: int, env_overrides: dict[str, Any] | None = None) -> DeployResult:
    """Fly ``episodes`` consecutive episodes of one arm-push env with the node's commands, a
    direct :class:`PolicyRunner` on the task's observation run beside it for comparison."""
    cfg = dataclasses.replace(registry.task_cfg("arm-push"), **(env_overrides or {}))
    env = registry.make_env("arm-push", cfg, 1, "cpu", seed)
    transport = MemoryTransport()
    clock = {"now": 1000.0}
    runner = PolicyRunner(export)
    node = PolicyNode(transport, load_robot(ARM_ROBOT), runner, clock=lambda: clock["now"])
    publish = ArmPublisher(transport)
    scale = np.array([f.scale for f in runner.io_spec.action_fields])
    offset = np.array([f.offset for f in runner.io_spec.action_fields])
    period = runner.io_spec.control_period_s

    def node_period(obs: np.ndarray) -> np.ndarray | None:
        clock["now"] += period
        publish(obs)
        return node.step(clock["now"])

    try:
        obs = env.reset(seed=seed)["policy"][0].numpy()
        # Arming (the re-arm rule): the task waits, frozen, until the node drives.
        command = node_period(obs)
        for _ in range(50):
            if command is not None and np.any(command != 0.0):
                break
            command = node_period(obs)
        direct = PolicyRunner(export)  # starts its plans where the armed node did
        done = successes = steps = 0
        worst = 0.0
        while done < episodes:
            assert command is not None, "the node sent no command"
            action = (command - offset) / scale
            worst = max(worst, float(np.max(np.abs(action - direct(obs)))))
            out, _reward, terminated, truncated, info = env.step(torch.as_tensor(action, dtype=torch.float32)[None])
            steps += 1
            if bool(terminated[0] | truncated[0]):
                done += 1
                successes += int(bool(info["success"][0]))
            obs = out["policy"][0].numpy()
            command = node_period(obs)
    finally:
        env.close()
    return DeployResult(done, successes, steps, worst, sum(node.rejections.values()))
