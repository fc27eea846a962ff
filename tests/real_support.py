"""Shared helpers of the ``tests/test_real_*.py`` files: small exports and message builders."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from export_support import linear_layer, write_io

from embodied import registry
from embodied.export.layers import with_io_symmetry
from embodied.export.onnx import export_onnx
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.policies.mlp import ExportedPolicy, mlp
from embodied.real import messages
from embodied.real.node import PolicyNode
from embodied.real.robot_config import ROBOTS_DIR, load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.transports.memory import MemoryTransport

# The shipped crazyflie_sim.yaml speaks the heading-frame quad-hover interface (pos_err_h, rot_hb,
# lin_vel_h, pos_err_int_h). While the task in this tree still has the world-frame fields, tests fly
# the shipped file with only the field names mapped back and the heading rotation dropped (the
# setpoint yaw is 0 there, so the rotation is the identity); once the task has the heading-frame
# fields, the shipped file is used as it is.
_HEADING_TO_WORLD = {
    "pos_err_h": "pos_err_w",
    "rot_hb": "rot_wb",
    "lin_vel_h": "lin_vel_w",
    "pos_err_int_h": "pos_err_int_w",
}


@functools.cache
def _quad_obs_names() -> tuple[str, ...]:
    env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 1, "cpu", 0)
    names = tuple(f.name for f in env.io_spec().obs_fields)
    env.close()
    return names


def quad_field(name: str) -> str:
    """The quad-hover observation field called ``name`` in the heading-frame interface, as this
    tree's task names it."""
    return _HEADING_TO_WORLD.get(name, name) if "pos_err_w" in _quad_obs_names() else name


@functools.cache
def quad_robot() -> Path:
    """The shipped crazyflie_sim.yaml, or its world-frame-named twin (see above)."""
    shipped = ROBOTS_DIR / "crazyflie_sim.yaml"
    if "pos_err_w" not in _quad_obs_names():
        return shipped
    data = yaml.safe_load(shipped.read_text())
    observation = {}
    for name, sig in data["observation"].items():
        if "ops" in sig:
            sig["ops"] = [op for op in sig["ops"] if not (isinstance(op, dict) and "world_to_heading" in op)]
        observation[quad_field(name)] = sig
    data["observation"] = observation
    for check in data["safety"]["envelope"].values():
        check["field"] = quad_field(check["field"])
    path = Path(tempfile.mkdtemp(prefix="embodied_robot_")) / "crazyflie_sim.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_robot_variant(tmp_path: Path, base: Path, edits: dict[str, Any]) -> Path:
    """A copy of robot config ``base`` with dotted-key ``edits`` applied (``None`` deletes)."""
    data = yaml.safe_load(base.read_text())
    for dotted, value in edits.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    path = tmp_path / f"variant_{len(list(tmp_path.glob('variant_*')))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


ARM_JOINTS = ("joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6")


def quad_spec(history: int = 2, pos_scale: float = 1.0, pos_err_integral: bool = False) -> IOSpec:
    """quad-hover's own interface (from the task), with a short action history (and the
    position-error integral when asked)."""
    cfg = dataclasses.replace(
        registry.task_cfg("quad-hover"), action_history=history, pos_err_integral=pos_err_integral
    )
    env = registry.make_env("quad-hover", cfg, 1, "cpu", 0)
    spec: IOSpec = env.io_spec()
    env.close()
    pos = quad_field("pos_err_h")
    fields = tuple(dataclasses.replace(f, scale=pos_scale) if f.name == pos else f for f in spec.obs_fields)
    return dataclasses.replace(spec, obs_fields=fields)


def arm_io_spec(history: int = 1, period_s: float = 0.02) -> IOSpec:
    """The interface real/robots/ros2_control_arm.yaml is written for."""
    return IOSpec(
        obs_fields=(
            ObsField("joint_pos", 6, "rad"),
            ObsField("joint_vel", 6, "rad/s", scale=0.1),
            ObsField("target_pos_b", 3, "m", "base"),
            ObsField("prev_actions", 6 * history),
        ),
        action_fields=(ActionField("joint_pos_target", 6, "rad", scale=1.5),),
        control_period_s=period_s,
        extra={"action_history": history},
    )


def export_policy(export_dir: Path, io_spec: IOSpec, seed: int = 0, bias: float = 0.0, gain: float = 1.0) -> Path:
    """Export a small random MLP for ``io_spec`` with the project's ONNX exporter.

    The last layer is ``gain`` x its init plus ``bias``, so tests can push actions to a known side.
    """
    torch.manual_seed(seed)
    net = mlp(io_spec.obs_dim, [16], io_spec.action_dim, act="tanh")
    with torch.no_grad():
        linear_layer(net, -1).weight.mul_(gain)
        linear_layer(net, -1).bias.fill_(bias)
    # With the task's yaw symmetry declared, the exported graph (and so its hash) carries the flip.
    module = with_io_symmetry(ExportedPolicy.from_normalizer(net, None, io_spec.obs_dim), io_spec)
    export_onnx(module, io_spec, export_dir)
    write_io(module, io_spec, export_dir)
    return export_dir


def odometry(
    pos_w: Any = (0.0, 0.0, 1.0),
    quat_xyzw: Any = (0.0, 0.0, 0.0, 1.0),
    lin_vel_b: Any = (0.0, 0.0, 0.0),
    ang_vel_b: Any = (0.0, 0.0, 0.0),
    stamp_s: float | None = None,
) -> Any:
    """A ``nav_msgs/Odometry`` (twist in the body frame, as ROS defines it), stamped ``stamp_s``
    (default: now)."""
    import time

    stamp_ns = time.time_ns() if stamp_s is None else round(stamp_s * 1e9)
    sec, nanosec = divmod(stamp_ns, 1_000_000_000)
    x, y, z = (float(v) for v in pos_w)
    qx, qy, qz, qw = (float(v) for v in quat_xyzw)
    vx, vy, vz = (float(v) for v in lin_vel_b)
    wx, wy, wz = (float(v) for v in ang_vel_b)
    return messages.make(
        "nav_msgs/msg/Odometry",
        {
            "header": {"frame_id": "world", "stamp": {"sec": sec, "nanosec": nanosec}},
            "child_frame_id": "cf",
            "pose": {
                "pose": {"position": {"x": x, "y": y, "z": z}, "orientation": {"x": qx, "y": qy, "z": qz, "w": qw}}
            },
            "twist": {"twist": {"linear": {"x": vx, "y": vy, "z": vz}, "angular": {"x": wx, "y": wy, "z": wz}}},
        },
    )


def joint_state(names: Any, position: Any, velocity: Any, stamp_s: float | None = None) -> Any:
    import time

    stamp_ns = time.time_ns() if stamp_s is None else round(stamp_s * 1e9)
    sec, nanosec = divmod(stamp_ns, 1_000_000_000)
    return messages.make(
        "sensor_msgs/msg/JointState",
        {
            "header": {"stamp": {"sec": sec, "nanosec": nanosec}},
            "name": list(names),
            "position": position,
            "velocity": velocity,
        },
    )


def wait_until(predicate: Any, timeout_s: float) -> bool:
    """Poll ``predicate()`` every 10 ms until it is true (``True``) or ``timeout_s`` passed (``False``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


_DOMAINS_HANDED_OUT: set[int] = set()


def free_domain_id() -> int:
    """A DDS domain unlikely to be used by a concurrent test run on this machine, and never one
    handed out before in this process: a node SIGKILLed in an earlier test stays in this process's
    discovery cache (its writers matched) until its lease expires."""
    choices = [d for d in range(100, 230) if d not in _DOMAINS_HANDED_OUT] or list(range(100, 230))
    domain = random.Random().choice(choices)
    _DOMAINS_HANDED_OUT.add(domain)
    return domain


PERIOD = 0.01
"""Control period of the quad-hover policies in these tests (s)."""


class Rig:
    """A node on an in-process transport with a hand-driven clock."""

    def __init__(self, export_dir: Path, robot: str | Path | None = None) -> None:
        self.now = 0.0
        self.transport = MemoryTransport()
        self.robot = load_robot(robot or quad_robot())
        self.node = PolicyNode(self.transport, self.robot, PolicyRunner(export_dir), clock=lambda: self.now)
        first = next(iter(self.robot.inputs.values()))
        self.sensor = self.transport.publisher(first.topic, first.type, first.qos)
        self.estop = self.transport.publisher(self.robot.safety.estop_topic, "std_msgs/msg/Bool", "latched")

    def period(self, message: Any | None) -> np.ndarray | None:
        """Advance one control period, optionally delivering ``message`` first; return the command."""
        self.now += PERIOD
        if message is not None:
            self.sensor(message)
        return self.node.step(self.now)

    def published(self) -> list[Any]:
        return self.transport.published[self.transport.resolve(self.robot.command.topic)]

    def diagnostics(self) -> dict[str, str]:
        """Key/values of the newest /diagnostics message."""
        last = self.transport.published["/diagnostics"][-1]
        return {kv.key: kv.value for kv in last.status[0].values}


@contextlib.contextmanager
def armed_running_node(export_dir: Path, robot_path: Path) -> Iterator[tuple[PolicyNode, MemoryTransport]]:
    """A node running its own loop (period :data:`PERIOD`) on an in-process transport, fed fresh
    odometry until it armed; the loop stops on exit. The feed stops when the block starts."""
    from embodied.real.safety import SafetyState

    transport = MemoryTransport()
    node = PolicyNode(transport, load_robot(robot_path), PolicyRunner(export_dir), period_s=PERIOD)
    odom = node.robot.inputs["odom"]
    sensor = transport.publisher(odom.topic, odom.type, odom.qos)
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 20.0
        while node.state is not SafetyState.ARMED and time.monotonic() < deadline:
            sensor(odometry())
            time.sleep(PERIOD / 2)
        assert node.state is SafetyState.ARMED
        yield node, transport
    finally:
        stop.set()
        loop.join(timeout=5.0)
