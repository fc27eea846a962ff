"""Message transports for the deployment runtime: Cyclone DDS (direct) and rclpy.

Both implement :class:`Transport`; everything above them (observation assembly, policy,
safety, control loop) is shared, so a node behaves the same over either.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from embodied.config import unknown_choice_message
from embodied.errors import EmbodiedError


@dataclass(frozen=True)
class QosProfile:
    """The subset of ROS 2 QoS the runtime sets (durability is always volatile)."""

    reliable: bool
    depth: int


QOS_PROFILES: dict[str, QosProfile] = {
    # rclpy's default for publishers and subscriptions (rmw_qos_profile_default).
    "reliable": QosProfile(reliable=True, depth=10),
    # rmw_qos_profile_sensor_data: a best-effort reader also matches reliable writers.
    "sensor": QosProfile(reliable=False, depth=5),
}


def qos_profile(name: str) -> QosProfile:
    if name not in QOS_PROFILES:
        raise EmbodiedError(unknown_choice_message("QoS profile", name, QOS_PROFILES))
    return QOS_PROFILES[name]


MessageCallback = Callable[[Any], None]
"""Called with each received message (in the transport's own message form)."""

Publish = Callable[[Any], None]
"""Publishes one ``rosbags`` message instance (see :mod:`embodied.real.messages`)."""


class Transport(Protocol):
    """What the runtime needs from a middleware. Topic names are ROS 2 names (``/cf/odom``)."""

    def subscribe(self, topic: str, type_name: str, qos: str, callback: MessageCallback) -> None:
        """Deliver every message on ``topic`` to ``callback`` (from a middleware thread)."""
        ...

    def publisher(self, topic: str, type_name: str, qos: str) -> Publish: ...

    def close(self) -> None: ...


TRANSPORTS: dict[str, str] = {
    "dds": "embodied.real.transports.dds:DdsTransport",
    "ros2": "embodied.real.transports.rclpy_node:RclpyTransport",
}
"""``--transport`` name -> ``module:class``; imported only when chosen."""


def add_middleware_arguments(parser: argparse.ArgumentParser) -> None:
    """``--domain-id``, ``--loopback`` and ``--param`` (shared by ``deploy`` and ``sim-robot``)."""
    parser.add_argument("--domain-id", type=int, default=None, help="DDS domain (default: $ROS_DOMAIN_ID or 0)")
    parser.add_argument("--loopback", action="store_true", help="pin Cyclone DDS to the loopback interface")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a robot config param, e.g. --param setpoint_w=[0,0,1] (repeatable)",
    )
