"""Message transports for the deployment runtime: Cyclone DDS (direct) and rclpy.

Both implement :class:`Transport`; everything above them (observation assembly, policy,
safety, control loop) is shared, so a node behaves the same over either.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from embodied.config import int_in_range, unknown_choice_message
from embodied.errors import EmbodiedError


@dataclass(frozen=True)
class QosProfile:
    """The subset of ROS 2 QoS the runtime sets."""

    reliable: bool
    depth: int
    transient_local: bool = False
    """Late joiners receive the last ``depth`` samples (ROS 2's "latched" topics)."""


QOS_PROFILES: dict[str, QosProfile] = {
    # rclpy's default for publishers and subscriptions (rmw_qos_profile_default).
    "reliable": QosProfile(reliable=True, depth=10),
    # rmw_qos_profile_sensor_data: a best-effort reader also matches reliable writers.
    "sensor": QosProfile(reliable=False, depth=5),
    # Latched state (e-stop, node state, ros_discovery_info): reliable, transient local, last one.
    "latched": QosProfile(reliable=True, depth=1, transient_local=True),
}


MAX_DOMAIN_ID = 232
"""The largest DDS domain id: the RTPS well-known ports (7400 + 250 * domain + offset) must fit
in 16 bits."""


def qos_profile(name: str) -> QosProfile:
    if name not in QOS_PROFILES:
        raise EmbodiedError(unknown_choice_message("QoS profile", name, QOS_PROFILES))
    return QOS_PROFILES[name]


def resolve_topic(name: str, namespace: str = "", node_name: str = "") -> str:
    """ROS 2 name resolution: ``/abs`` stays, ``rel`` -> ``/<namespace>/rel``, ``~/x`` ->
    ``/<namespace>/<node_name>/x``. ``namespace`` may be given with or without the leading slash."""
    if not name:
        raise EmbodiedError("empty topic name")
    ns = "/" + namespace.strip("/") if namespace.strip("/") else ""
    if name.startswith("~"):
        if not node_name:
            raise EmbodiedError(f"topic {name!r} is private (~) but no node name is known")
        name = f"{ns}/{node_name}{name[1:]}"
    elif not name.startswith("/"):
        name = f"{ns}/{name}"
    if "//" in name or name.endswith("/"):
        raise EmbodiedError(f"invalid topic name {name!r} (empty token)")
    return name


MessageCallback = Callable[[Any], None]
"""Called with each received message (in the transport's own message form)."""

Publish = Callable[[Any], None]
"""Publishes one ``rosbags`` message instance (see :mod:`embodied.real.messages`)."""


class Transport(Protocol):
    """What the runtime needs from a middleware. Topic names are ROS 2 names (``/cf/odom``)."""

    def subscribe(
        self,
        topic: str,
        type_name: str,
        qos: str,
        callback: MessageCallback,
        on_publishers_lost: Callable[[], None] | None = None,
    ) -> None:
        """Deliver every message on ``topic`` to ``callback`` (from a middleware thread);
        ``on_publishers_lost``: called when the last publisher leaves (where detectable)."""
        ...

    def publisher(self, topic: str, type_name: str, qos: str, deadline_s: float | None = None) -> Publish:
        """``deadline_s``: DEADLINE QoS offered (the longest promised gap between samples; None: none)."""
        ...

    def close(self) -> None: ...


TRANSPORTS: dict[str, str] = {
    "dds": "embodied.real.transports.dds:DdsTransport",
    "ros2": "embodied.real.transports.rclpy_node:RclpyTransport",
}
"""``--transport`` name -> ``module:class``; imported only when chosen."""


def add_middleware_arguments(parser: argparse.ArgumentParser) -> None:
    """``--domain-id``, ``--loopback`` and ``--param`` (shared by ``deploy`` and ``sim-robot``)."""
    parser.add_argument(
        "--domain-id",
        type=int_in_range(0, MAX_DOMAIN_ID),
        default=None,
        help=f"DDS domain 0..{MAX_DOMAIN_ID} (default: $ROS_DOMAIN_ID or 0)",
    )
    parser.add_argument("--loopback", action="store_true", help="pin Cyclone DDS to the loopback interface")
    parser.add_argument(
        "--ros-distro",
        choices=("humble", "jazzy"),
        default="jazzy",
        help="layout of ros_discovery_info for the ROS 2 peers (GID size; jazzy also fits iron and newer)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a robot config param, e.g. --param setpoint_w=[0,0,1] (repeatable)",
    )
