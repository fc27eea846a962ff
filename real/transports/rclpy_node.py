"""rclpy transport: the same node logic as the DDS path, inside a real ROS 2 node.

Deliberately thin: it only maps :class:`~embodied.real.transports.Transport` onto rclpy
(subscriptions, publishers, QoS) and converts outgoing ``rosbags`` messages into rclpy
messages field by field. Observation assembly, policy, safety and the control loop are the
shared :class:`~embodied.real.node.PolicyNode`. rclpy is imported lazily; it comes with a
sourced ROS 2 Humble/Jazzy install (``source /opt/ros/<distro>/setup.bash``), not from PyPI.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.transports import MessageCallback, Publish, qos_profile

INSTALL_HINT = (
    "rclpy is not importable: install ROS 2 Humble or Jazzy (https://docs.ros.org/en/jazzy/Installation.html), "
    "then `source /opt/ros/jazzy/setup.bash` in this shell, or use `--transport dds` (Cyclone DDS from PyPI)"
)


log = logging.getLogger(__name__)


def rclpy_available() -> bool:
    try:
        importlib.import_module("rclpy")
    except ImportError:
        return False
    return True


def _message_class(type_name: str) -> Any:
    pkg, kind, name = messages.check_type(type_name).split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def to_rclpy(message: Any, type_name: str) -> Any:
    """Copy a ``rosbags`` message into a new rclpy message of the same type."""

    def build(name: str, values: dict[str, Any]) -> Any:
        out = _message_class(name)()
        for field_name, value in values.items():
            setattr(out, field_name, value)
        return out

    return messages.convert(message, type_name, build)


def _qos(name: str, deadline_s: float | None = None) -> Any:
    from rclpy.duration import Duration
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    profile = qos_profile(name)
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=profile.depth,
        reliability=ReliabilityPolicy.RELIABLE if profile.reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if profile.transient_local else DurabilityPolicy.VOLATILE,
    )
    if deadline_s is not None:
        qos.deadline = Duration(nanoseconds=round(deadline_s * 1e9))
    return qos


def liveliness_callbacks(on_publishers_lost: Callable[[], None]) -> Any:
    """``SubscriptionEventCallbacks`` that call ``on_publishers_lost`` when the subscription's
    count of live publishers drops to zero.

    The liveliness-changed event exists on Humble and Jazzy alike (the ``matched`` event only
    from Iron on); with the default automatic liveliness a publisher's count drops when the
    publisher (or its whole process) is destroyed, or when its lease expires after a crash. The
    class lives in ``rclpy.event_handler`` from Iron on and in ``rclpy.qos_event`` on Humble.
    """
    try:
        from rclpy.event_handler import SubscriptionEventCallbacks
    except ImportError:  # Humble
        from rclpy.qos_event import SubscriptionEventCallbacks

    def on_liveliness(info: Any) -> None:
        if info.alive_count == 0 and info.alive_count_change < 0:
            on_publishers_lost()

    return SubscriptionEventCallbacks(liveliness=on_liveliness)


class RclpyTransport:
    """An rclpy node spun on a background thread; callbacks run on that thread."""

    def __init__(self, node_name: str = "embodied_policy", node: Any = None, spin: bool = True) -> None:
        """``spin=False``: the caller already spins ``node`` (e.g. a lifecycle node's executor)."""
        try:
            import rclpy
            from rclpy.executors import SingleThreadedExecutor
        except ImportError as err:
            raise EmbodiedError(INSTALL_HINT) from err
        self._owns_context = node is None
        if node is None:
            if not rclpy.ok():
                rclpy.init()
            node = rclpy.create_node(node_name)
        self.node = node
        self._publishers: list[Any] = []
        self._executor: Any = None
        if spin:
            self._executor = SingleThreadedExecutor()
            self._executor.add_node(node)
            threading.Thread(target=self._executor.spin, name="rclpy-spin", daemon=True).start()

    def subscribe(
        self, topic: str, type_name: str, qos: str, callback: MessageCallback, on_publishers_lost: Any = None
    ) -> None:
        """``on_publishers_lost`` is called when the last live publisher leaves (liveliness)."""
        kwargs: dict[str, Any] = {}
        if on_publishers_lost is not None:
            kwargs["event_callbacks"] = liveliness_callbacks(on_publishers_lost)
        self.node.create_subscription(_message_class(type_name), topic, callback, _qos(qos), **kwargs)

    def publisher(self, topic: str, type_name: str, qos: str, deadline_s: float | None = None) -> Publish:
        """``deadline_s``: the DEADLINE QoS offered (see :meth:`DdsTransport.publisher`)."""
        pub = self.node.create_publisher(_message_class(type_name), topic, _qos(qos, deadline_s))
        self._publishers.append(pub)

        def publish(message: Any) -> None:
            pub.publish(to_rclpy(message, type_name))

        return publish

    def close(self, ack_timeout_s: float = 0.5) -> None:
        """Wait (at most ``ack_timeout_s`` in all) for matched reliable subscriptions to
        acknowledge what was published last (the final safe command), then shut down."""
        import time

        import rclpy
        from rclpy.duration import Duration

        deadline = time.monotonic() + ack_timeout_s
        for pub in self._publishers:
            try:
                pub.wait_for_all_acked(Duration(nanoseconds=max(0, round((deadline - time.monotonic()) * 1e9))))
            except Exception as err:  # best effort publishers, a context already shut down
                log.debug("wait_for_all_acked: %s", err)

        if self._executor is not None:
            self._executor.shutdown()
        if self._owns_context:
            self.node.destroy_node()
            if rclpy.ok():
                rclpy.shutdown()
