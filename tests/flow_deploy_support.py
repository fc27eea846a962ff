"""Flies an exported arm-push policy through the deploy node (``PolicyNode``, in-process
transport, hand-driven clock) against the MuJoCo task, beside the same export run directly on
the task's observation. Used by tests/test_flow_deploy.py and for the deploy figures in
docs/benchmarks/finetuning.md.

The messages the node reads (joint states, the fingertip, block and goal positions, the block
velocity, and the camera picture where the robot config names a camera) are published from the
task's own observation by :class:`~embodied.real.sim_state.ArmPushState`, as an arm driver, a
block tracker and a camera driver would publish them (``embodied sim-robot arm-push`` serves the
same over DDS); here in-process, with a hand-driven clock.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied import registry
from embodied.env import IMAGE_GROUP
from embodied.real.node import PolicyNode
from embodied.real.robot_config import ROBOTS_DIR, RobotConfig, load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.sim_state import ArmPushState
from embodied.real.transports.memory import MemoryTransport

ARM_ROBOT = ROBOTS_DIR / "arm_push_sim.yaml"


@dataclasses.dataclass
class DeployResult:
    episodes: int
    successes: int
    steps: int
    max_action_diff: float
    """Max ``|node action - direct action|`` (normalized units) over every step flown."""
    rejections: int


class ArmPublisher:
    """Publishes one arm-push observation ``[18]`` (and its camera picture, when the robot config
    names a camera) as the robot config's input messages (:class:`ArmPushState`, what
    ``embodied sim-robot arm-push`` publishes), stamped with the wall clock."""

    def __init__(self, transport: MemoryTransport, robot: RobotConfig) -> None:
        self.state = ArmPushState(robot, transport)
        self.stamp_ns = 0

    def __call__(self, obs: np.ndarray, image: np.ndarray | None = None) -> None:
        # wall-clock stamps, strictly increasing (the node judges stamps against the wall clock)
        self.stamp_ns = max(time.time_ns(), self.stamp_ns + 1)
        groups = {"policy": obs[None]} | ({} if image is None else {IMAGE_GROUP: image[None]})
        self.state.publish(groups, self.stamp_ns)


def fly_arm_push(
    export: Path,
    episodes: int,
    seed: int,
    env_overrides: dict[str, Any] | None = None,
    robot_path: Path = ARM_ROBOT,
    env: Any = None,
) -> DeployResult:
    """Fly ``episodes`` consecutive episodes of one arm-push env with the node's commands, a
    direct :class:`PolicyRunner` on the task's observation (and camera picture) run beside it for
    comparison. ``env``: a one-env arm-push to fly (closed here; default: the registry's task)."""
    if env is None:
        cfg = dataclasses.replace(registry.task_cfg("arm-push"), **(env_overrides or {}))
        env = registry.make_env("arm-push", cfg, 1, "cpu", seed)
    transport = MemoryTransport()
    clock = {"now": 1000.0}
    runner = PolicyRunner(export)
    robot = load_robot(robot_path)
    node = PolicyNode(transport, robot, runner, clock=lambda: clock["now"])
    publish = ArmPublisher(transport, robot)
    scale = np.array([f.scale for f in runner.io_spec.action_fields])
    offset = np.array([f.offset for f in runner.io_spec.action_fields])
    period = runner.io_spec.control_period_s

    def node_period(obs: np.ndarray, image: np.ndarray | None) -> np.ndarray | None:
        clock["now"] += period
        publish(obs, image)
        return node.step(clock["now"])

    def split(out: Any) -> tuple[np.ndarray, np.ndarray | None]:
        return out["policy"][0].numpy(), (out[IMAGE_GROUP][0].numpy() if IMAGE_GROUP in out else None)

    try:
        obs, image = split(env.reset(seed=seed))
        # Arming (the re-arm rule): the task waits, frozen, until the node drives.
        command = node_period(obs, image)
        for _ in range(50):
            if command is not None and np.any(command != 0.0):
                break
            command = node_period(obs, image)
        direct = PolicyRunner(export)  # starts its plans where the armed node did
        done = successes = steps = 0
        worst = 0.0
        while done < episodes:
            assert command is not None, "the node sent no command"
            action = (command - offset) / scale
            worst = max(worst, float(np.max(np.abs(action - direct(obs, image)))))
            out, _reward, terminated, truncated, info = env.step(torch.as_tensor(action, dtype=torch.float32)[None])
            steps += 1
            if bool(terminated[0] | truncated[0]):
                done += 1
                successes += int(bool(info["success"][0]))
            obs, image = split(out)
            command = node_period(obs, image)
    finally:
        env.close()
    return DeployResult(done, successes, steps, worst, sum(node.rejections.values()))
