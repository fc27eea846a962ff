"""What ``embodied sim-robot`` publishes of a task's state: the messages of the robot config's
inputs, stamped, as the robot's drivers would send them.

- :class:`OdometryState` (tasks on the quadrotor backend, :class:`~embodied.env.PhysicalStateEnv`):
  ``nav_msgs/Odometry`` from the raw rigid-body state (pose in the world, twist in the body
  frame, as ROS defines it) on every odometry input.
- :class:`ArmPushState` (``arm-push``): the arm driver's ``sensor_msgs/JointState`` (by name, in
  another order than the config's, as drivers do), the tracked fingertip, block and goal points
  (``geometry_msgs/PointStamped``), the block's velocity (``TwistStamped``), and the camera's
  picture (``sensor_msgs/Image``, ``bgr8`` with padded rows, as OpenCV-based drivers send it)
  when the robot config names a camera. Built from the task's observation (layout:
  docs/conventions.md, "arm-push"), so the node's rebuilt observation can be compared with it.

:func:`state_publisher` picks the one for an env; another task is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from embodied.env import IMAGE_GROUP, PhysicalStateEnv
from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.observation import quat_to_rotmat
from embodied.real.robot_config import IMAGE_TYPE, RobotConfig
from embodied.real.transports import Transport

ODOMETRY = "nav_msgs/msg/Odometry"
ARM_JOINTS = ("shoulder", "elbow", "wrist")
"""arm-push's joints, as its driver names them (real/robots/arm_push_sim.yaml selects them by name)."""
ARM_JOINT_ORDER = (2, 0, 1)
"""The order the simulated driver lists them in: not the config's, so the node must select by name."""


class StatePublisher(Protocol):
    def publish(self, obs: Mapping[str, Any], stamp_ns: int) -> None:
        """Publish the state behind ``obs`` (one env's observation dict), stamped ``stamp_ns``."""
        ...


def _header(stamp_ns: int, frame_id: str) -> dict[str, Any]:
    return {"stamp": {"sec": stamp_ns // 1_000_000_000, "nanosec": stamp_ns % 1_000_000_000}, "frame_id": frame_id}


def _xyz(v: Any) -> dict[str, float]:
    return {"x": float(v[0]), "y": float(v[1]), "z": float(v[2])}


def odometry_values(
    pos_w: np.ndarray, quat_wxyz: np.ndarray, lin_vel_w: np.ndarray, ang_vel_b: np.ndarray, now_ns: int
) -> dict[str, Any]:
    """Nested field values of a ``nav_msgs/Odometry`` for one rigid body (twist in the body frame),
    stamped ``now_ns`` (nanoseconds since the epoch)."""
    w, x, y, z = (float(v) for v in quat_wxyz)
    lin_vel_b = quat_to_rotmat(np.asarray(quat_wxyz, dtype=np.float64)).T @ lin_vel_w
    return {
        "header": _header(now_ns, "world"),
        "child_frame_id": "base_link",
        "pose": {"pose": {"position": _xyz(pos_w), "orientation": {"x": x, "y": y, "z": z, "w": w}}},
        "twist": {"twist": {"linear": _xyz(lin_vel_b), "angular": _xyz(ang_vel_b)}},
    }


class OdometryState:
    """``nav_msgs/Odometry`` of the env's rigid body on every odometry input of ``robot``."""

    def __init__(self, env: PhysicalStateEnv, robot: RobotConfig, transport: Transport) -> None:
        inputs = [i for i in robot.inputs.values() if i.type == ODOMETRY]
        others = [i.name for i in robot.inputs.values() if i.type != ODOMETRY]
        if not inputs or others:
            raise EmbodiedError(
                f"{robot.path}: sim-robot publishes {ODOMETRY} only for this task; the config's inputs "
                f"{others or '(none)'} cannot be simulated"
            )
        self.env = env
        self._publishers = [transport.publisher(i.topic, i.type, i.qos) for i in inputs]

    def publish(self, obs: Mapping[str, Any], stamp_ns: int) -> None:
        state = self.env.physical_state()

        def row(key: str) -> np.ndarray:
            return state[key][0].detach().cpu().double().numpy()

        values = odometry_values(row("position_w"), row("quat_wb"), row("lin_vel_w"), row("ang_vel_b"), stamp_ns)
        message = messages.make(ODOMETRY, values)
        for publish in self._publishers:
            publish(message)


def image_message(image_rgb: np.ndarray, header: dict[str, Any], pad_bytes: int = 4) -> Any:
    """``sensor_msgs/Image`` of ``image_rgb [H, W, 3]`` uint8 as a camera driver may send it:
    ``bgr8`` (OpenCV's order), each row padded by ``pad_bytes``."""
    height, width, _ = image_rgb.shape
    step = width * 3 + pad_bytes
    rows = np.zeros((height, step), dtype=np.uint8)
    rows[:, : width * 3] = image_rgb[:, :, ::-1].reshape(height, width * 3)
    values = {"header": header, "height": height, "width": width, "encoding": "bgr8", "step": step}
    return messages.make(IMAGE_TYPE, {**values, "data": rows.reshape(-1)})


class ArmPushState:
    """arm-push's observation ``[18]`` (and camera picture) as the inputs of
    ``real/robots/arm_push_sim.yaml`` (plus its ``camera`` when the config names one)."""

    INPUTS = ("joints", "fingertip", "block", "block_twist", "goal")

    def __init__(self, robot: RobotConfig, transport: Transport) -> None:
        missing = [name for name in self.INPUTS if name not in robot.inputs]
        if missing:
            raise EmbodiedError(
                f"{robot.path}: sim-robot publishes arm-push's inputs {list(self.INPUTS)} (real/robots/arm_push_sim.yaml); "
                f"the config lacks {missing}"
            )
        self.pub = {name: transport.publisher(i.topic, i.type, i.qos) for name, i in robot.inputs.items()}
        self.camera = robot.camera.input if robot.camera is not None else None

    def publish(self, obs: Mapping[str, Any], stamp_ns: int) -> None:
        """``obs``: one env's observation groups (tensors or arrays, ``[1, ...]``)."""
        o = [float(v) for v in obs["policy"][0]]
        base = _header(stamp_ns, "base")

        def point(x: float, y: float) -> Any:
            return messages.make(
                "geometry_msgs/msg/PointStamped", {"header": base, "point": {"x": x, "y": y, "z": 0.0}}
            )

        joints = {
            "header": base,
            "name": [ARM_JOINTS[i] for i in ARM_JOINT_ORDER],
            "position": np.array([o[i] for i in ARM_JOINT_ORDER]),
            "velocity": np.array([o[3 + i] for i in ARM_JOINT_ORDER]),
            "effort": np.zeros(0),
        }
        self.pub["joints"](messages.make("sensor_msgs/msg/JointState", joints))
        self.pub["fingertip"](point(o[6], o[7]))
        self.pub["block"](point(o[8], o[9]))
        twist = {"linear": {"x": o[10], "y": o[11], "z": 0.0}, "angular": {"x": 0.0, "y": 0.0, "z": 0.0}}
        self.pub["block_twist"](messages.make("geometry_msgs/msg/TwistStamped", {"header": base, "twist": twist}))
        self.pub["goal"](point(o[12], o[13]))
        if self.camera is not None:
            if IMAGE_GROUP not in obs:
                raise EmbodiedError(
                    f"the robot config names camera input {self.camera!r} but the task renders no images: "
                    "run sim-robot with --env backend.camera=NAME"
                )
            self.pub[self.camera](image_message(np.asarray(obs[IMAGE_GROUP][0]), _header(stamp_ns, "camera")))


def state_publisher(task: str, env: Any, robot: RobotConfig, transport: Transport) -> StatePublisher:
    """The publisher of ``env``'s state (task ``task``) for ``robot`` (see the module docstring)."""
    if isinstance(env, PhysicalStateEnv):
        return OdometryState(env, robot, transport)
    if task == "arm-push":
        return ArmPushState(robot, transport)
    raise EmbodiedError(
        f"sim-robot serves tasks on the quadrotor backend (odometry) and arm-push, not {task!r} "
        f"({type(env).__name__} has no publisher of its state)"
    )
