"""The ROS 2 package's managed node (``embodied_ros2/policy_node.py``): lifecycle transitions and
live parameters map onto the runtime, with the safe command on every way out.

rclpy cannot be installed here, so the node process's rclpy is replaced by a minimal stand-in:
a lifecycle ``Node`` base with parameters, a logger, a clock and timers, and
``rcl_interfaces.msg.SetParametersResult``. Its topics go through the in-process transport.
The real rclpy path is what ``ros2 launch embodied_ros2 policy.launch.py`` runs (see
real/ros2/README.md); these tests cover the package's own logic on top of it.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from real_support import ARM_JOINTS, arm_io_spec, export_policy, odometry, quad_robot, quad_spec

from embodied.real import messages
from embodied.real.transports.memory import MemoryTransport

NODE_FILE = Path(__file__).resolve().parents[1] / "real/ros2/embodied_ros2/embodied_ros2/policy_node.py"
OK, FAILURE = "SUCCESS", "FAILURE"


class _Result:
    def __init__(self, successful: bool, reason: str = "") -> None:
        self.successful, self.reason = successful, reason


class FakeLifecycleNode:
    """What the package uses of ``rclpy.lifecycle.Node``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._params: dict[str, Any] = {}
        self._callbacks: list[Callable[[list[Any]], Any]] = []

    def declare_parameter(self, name: str, value: Any) -> None:
        self._params[name] = value

    def get_parameter(self, name: str) -> Any:
        return types.SimpleNamespace(value=self._params[name])

    def add_on_set_parameters_callback(self, callback: Callable[[list[Any]], Any]) -> None:
        self._callbacks.append(callback)

    def set_parameter(self, name: str, value: Any) -> Any:
        result = self._callbacks[0]([types.SimpleNamespace(name=name, value=value)])
        if result.successful:
            self._params[name] = value
        return result

    def get_logger(self) -> logging.Logger:
        return logging.getLogger("fake_rclpy")

    def get_clock(self) -> Any:
        return types.SimpleNamespace(now=lambda: types.SimpleNamespace(nanoseconds=time.time_ns()))

    def create_timer(self, period_s: float, callback: Callable[[], None]) -> None:
        pass

    controller_joints: tuple[str, ...] = ()
    """What the fake ``<controller>/get_parameters`` service answers for ``joints``."""

    def create_client(self, srv_type: Any, name: str) -> Any:
        joints = self.controller_joints
        value = types.SimpleNamespace(string_array_value=list(joints))
        future = types.SimpleNamespace(done=lambda: True, result=lambda: types.SimpleNamespace(values=[value]))
        return types.SimpleNamespace(wait_for_service=lambda timeout_sec: True, call_async=lambda request: future)

    def on_activate(self, state: Any) -> str:
        return OK

    def on_deactivate(self, state: Any) -> str:
        return OK


@pytest.fixture
def node_class(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, MemoryTransport]:
    rcl_interfaces = types.ModuleType("rcl_interfaces")
    rcl_msg = types.ModuleType("rcl_interfaces.msg")
    rcl_msg.SetParametersResult = _Result  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rcl_interfaces", rcl_interfaces)
    monkeypatch.setitem(sys.modules, "rcl_interfaces.msg", rcl_msg)
    rcl_srv = types.ModuleType("rcl_interfaces.srv")
    rcl_srv.GetParameters = types.SimpleNamespace(Request=lambda names: names)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rcl_interfaces.srv", rcl_srv)
    transport = MemoryTransport()
    import embodied.real.transports.rclpy_node as rclpy_node

    monkeypatch.setattr(rclpy_node, "RclpyTransport", lambda node, spin: transport)
    spec = importlib.util.spec_from_file_location("policy_node_under_test", NODE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._policy_node_class(FakeLifecycleNode, OK, FAILURE), transport


def _wait(condition: Callable[[], bool], publish: Callable[[], None], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        publish()
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_lifecycle_and_parameters_drive_the_runtime(node_class: tuple[Any, MemoryTransport], tmp_path: Path) -> None:
    cls, transport = node_class
    node = cls()
    assert node.on_configure(None) == FAILURE  # export_dir is required
    node._params["export_dir"] = str(export_policy(tmp_path / "export", quad_spec(history=2), bias=0.5))
    node._params["robot_config"] = str(quad_robot())
    assert node.on_configure(None) == OK
    odom = transport.publisher("cf/odom", "nav_msgs/msg/Odometry", "sensor")
    sent = transport.published["/cf/motor_thrust"]

    def last() -> np.ndarray:
        return messages.to_vector(sent[-1].data)

    def flying() -> bool:
        return bool(sent) and bool(np.any(last() != 0.0))

    try:
        time.sleep(0.3)
        odom(odometry())
        assert not _wait(flying, lambda: odom(odometry()), timeout_s=0.5)  # configured, inactive: safe only
        assert node.policy.state.value == "inactive"
        assert node.on_activate(None) == OK
        assert _wait(flying, lambda: odom(odometry())), node.policy.status()
        n = len(sent)
        assert node.set_parameter("params_json", '{"setpoint_w": [0, 0, 1.1]}').successful
        assert np.all(messages.to_vector(sent[n].data) == 0.0)  # the next command is the safe one
        for name, value in (("export_dir", "/elsewhere"), ("task", "arm-push"), ("device", "cuda")):
            assert not node.set_parameter(name, value).successful, name  # read at configure: needs cleanup
        assert not node.set_parameter("params_json", '{"no_such_param": [1]}').successful
        assert _wait(flying, lambda: odom(odometry())), node.policy.status()
        assert node.on_deactivate(None) == OK
        assert np.all(last() == 0.0)
        assert node.on_activate(None) == OK
        assert _wait(flying, lambda: odom(odometry()))
        assert node.on_cleanup(None) == OK
        assert np.all(last() == 0.0) and node.policy is None
        count = len(sent)
        time.sleep(0.1)
        assert len(sent) == count  # the loop is gone
    finally:
        node._stop_loop("test end")


@pytest.mark.parametrize("reverse", [False, True])
def test_configure_checks_the_controllers_joint_order(
    node_class: tuple[Any, MemoryTransport], tmp_path: Path, reverse: bool
) -> None:
    cls, _transport = node_class
    node = cls()
    node.controller_joints = tuple(reversed(ARM_JOINTS)) if reverse else ARM_JOINTS
    node._params["export_dir"] = str(export_policy(tmp_path / "export", arm_io_spec()))
    node._params["robot_config"] = "ros2_control_arm"
    try:
        assert node.on_configure(None) == (FAILURE if reverse else OK)
        assert (node.policy is None) == reverse
    finally:
        node._stop_loop("test end")


@pytest.mark.parametrize(("task", "device", "expected"), [("", "cpu", None), ("arm-push", "cuda:1", "arm-push")])
def test_configure_hands_task_and_device_to_the_loader(
    node_class: tuple[Any, MemoryTransport], monkeypatch: pytest.MonkeyPatch, task: str, device: str, expected: Any
) -> None:
    """The ``task`` / ``device`` parameters reach the policy loader as ``embodied deploy --task/--device``
    (an empty task: the robot config's ``task:``)."""
    import embodied.real.deploy as deploy_module

    seen: dict[str, Any] = {}

    def loader(transport: Any, export: Any, robot: Any, params: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop after the call")  # configure then fails and stays unconfigured

    monkeypatch.setattr(deploy_module, "build_node", loader)
    cls, _transport = node_class
    node = cls()
    node._params.update(export_dir="lerobot:/some/checkpoint", task=task, device=device)
    assert node.on_configure(None) == FAILURE
    assert seen["task"] == expected and seen["device"] == device
