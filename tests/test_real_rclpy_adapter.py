"""The rclpy adapter's message conversion, against stand-in rclpy message classes.

rclpy cannot be installed here (it comes with a ROS 2 distribution), so the generated message
modules (``std_msgs.msg``, ``nav_msgs.msg``, ...) are replaced by small classes that behave like
rclpy's: default-constructible, attribute setters, ``get_fields_and_field_types()``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from real_support import joint_state, odometry

from embodied.real import messages
from embodied.real.messages import NAME
from embodied.real.transports.rclpy_node import rclpy_available, to_rclpy


def _fake_class(type_name: str) -> type:
    names = [n for n, _ in messages.fields(type_name)]

    def init(self: Any) -> None:
        for name, (kind, spec) in messages.fields(type_name):
            setattr(self, name, _module_class(spec)() if kind == NAME else None)

    return type(
        type_name.rsplit("/", 1)[1],
        (),
        {
            "__slots__": names,
            "__init__": init,
            "get_fields_and_field_types": classmethod(lambda cls: dict.fromkeys(names)),
        },
    )


def _module_class(type_name: str) -> type:
    pkg, kind, name = type_name.split("/")
    return getattr(sys.modules[f"{pkg}.{kind}"], name)


@pytest.fixture
def fake_rclpy_messages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    store = messages.typestore()
    for type_name in store.fielddefs:
        if "/msg/" not in type_name:
            continue
        pkg, kind, name = type_name.split("/")
        module_name = f"{pkg}.{kind}"
        if module_name not in sys.modules:
            monkeypatch.setitem(sys.modules, pkg, types.ModuleType(pkg))
            monkeypatch.setitem(sys.modules, module_name, types.ModuleType(module_name))
    for type_name in store.fielddefs:
        if "/msg/" in type_name:
            pkg, kind, name = type_name.split("/")
            setattr(sys.modules[f"{pkg}.{kind}"], name, _fake_class(type_name))
    yield


@pytest.mark.skipif(rclpy_available(), reason="real rclpy present: stand-ins would shadow it")
def test_to_rclpy_copies_every_field(fake_rclpy_messages: None) -> None:
    src = odometry((1.0, 2.0, 3.0), (0.0, 0.0, 0.6, 0.8), (0.5, -0.5, 0.0), (0.1, 0.2, 0.3))
    out = to_rclpy(src, "nav_msgs/msg/Odometry")
    assert type(out).__name__ == "Odometry"
    assert out.pose.pose.position.z == 3.0 and out.pose.pose.orientation.w == 0.8
    assert isinstance(out.pose.covariance, list) and len(out.pose.covariance) == 36
    # The runtime reads rclpy messages the same way as rosbags' and Cyclone's.
    np.testing.assert_allclose(messages.to_vector(out.twist.twist.angular), [0.1, 0.2, 0.3])
    cmd = messages.make("std_msgs/msg/Float32MultiArray", {"data": np.array([1.5, 2.5], dtype=np.float32)})
    out_cmd = to_rclpy(cmd, "std_msgs/msg/Float32MultiArray")
    assert out_cmd.data == [1.5, 2.5] and all(type(v) is float for v in out_cmd.data)
    js = to_rclpy(joint_state(["a", "b"], [0.1, 0.2], [0.0, 0.0]), "sensor_msgs/msg/JointState")
    assert js.name == ["a", "b"] and js.position == [0.1, 0.2]


@pytest.mark.skipif(rclpy_available(), reason="real rclpy present: stand-ins would shadow it")
@pytest.mark.parametrize("module", ["rclpy.event_handler", "rclpy.qos_event"])
def test_publisher_lost_through_liveliness_events(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """rclpy mode: the subscription's liveliness event reports the last publisher leaving.

    Stand-ins for rclpy's ``SubscriptionEventCallbacks`` (Iron+: ``rclpy.event_handler``, Humble:
    ``rclpy.qos_event``) and the node; what this cannot show is that rmw raises the event when a
    peer exits (Cyclone does on writer deletion and lease expiry).
    """

    class SubscriptionEventCallbacks:
        def __init__(self, liveliness: Any = None) -> None:
            self.liveliness = liveliness

    monkeypatch.setitem(sys.modules, "rclpy", types.ModuleType("rclpy"))
    fake = types.ModuleType(module)
    fake.SubscriptionEventCallbacks = SubscriptionEventCallbacks  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module, fake)
    if module == "rclpy.qos_event":
        monkeypatch.setitem(sys.modules, "rclpy.event_handler", None)  # absent on Humble

    from embodied.real.transports.rclpy_node import RclpyTransport

    created: list[dict[str, Any]] = []

    class Node:
        def create_subscription(self, *args: Any, **kwargs: Any) -> None:
            created.append(kwargs)

    transport = RclpyTransport.__new__(RclpyTransport)
    transport.node = Node()
    monkeypatch.setattr("embodied.real.transports.rclpy_node._message_class", lambda _t: object)
    monkeypatch.setattr("embodied.real.transports.rclpy_node._qos", lambda _q: None)
    lost: list[bool] = []
    transport.subscribe("cf/odom", "nav_msgs/msg/Odometry", "sensor", print, lambda: lost.append(True))
    transport.subscribe("cf/estop", "std_msgs/msg/Bool", "reliable", print)
    assert "event_callbacks" not in created[1]
    on_liveliness = created[0]["event_callbacks"].liveliness
    on_liveliness(types.SimpleNamespace(alive_count=1, alive_count_change=-1))  # one of two left
    on_liveliness(types.SimpleNamespace(alive_count=1, alive_count_change=1))
    assert lost == []
    on_liveliness(types.SimpleNamespace(alive_count=0, alive_count_change=-1))
    assert lost == [True]
