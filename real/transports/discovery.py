"""``ros_discovery_info``: how a DDS-mode node shows up in ``ros2 node list`` / ``ros2 topic info``.

ROS 2's DDS-based rmw layers (rmw_cyclonedds_cpp among them) do not derive nodes from DDS
entities: every participant publishes one ``rmw_dds_common/msg/ParticipantEntitiesInfo`` on the
DDS topic ``ros_discovery_info`` (no ``rt/`` prefix; reliable, transient local, keep last 1)
listing its nodes and, per node, the GIDs of the readers and writers it owns. A GID is the DDS
entity GUID (16 bytes), zero-padded to the distro's GID size.

The message layout (``rmw_dds_common/msg/*.msg``) differs between distros only in the GID size:
``char[24] data`` up to Humble, ``char[16] data`` from Iron (Jazzy) on. ``char`` is an unsigned
byte on the wire. Pick the distro of the ROS 2 peers (``--ros-distro``; default Jazzy).
"""

from __future__ import annotations

from functools import cache
from typing import Any

DISCOVERY_TOPIC = "ros_discovery_info"
GID_SIZE: dict[str, int] = {"humble": 24, "jazzy": 16}
"""``rmw_dds_common/msg/Gid`` ``data`` length per ROS 2 distro."""
DEFAULT_DISTRO = "jazzy"


@cache
def participant_entities_info(distro: str) -> Any:
    """The Cyclone DDS struct of ``rmw_dds_common/msg/ParticipantEntitiesInfo`` for ``distro``."""
    from cyclonedds.idl import make_idl_struct, types

    # Typed as Any: Cyclone's generic markers are subscripted at run time in a way its stubs
    # do not declare.
    t: Any = types

    if distro not in GID_SIZE:
        raise ValueError(f"unknown ROS 2 distro {distro!r}; known: {', '.join(GID_SIZE)}")
    prefix = "rmw_dds_common::msg::dds_::"
    gid = make_idl_struct("Gid_", f"{prefix}Gid_", {"data": t.array[t.uint8, GID_SIZE[distro]]})
    node = make_idl_struct(
        "NodeEntitiesInfo_",
        f"{prefix}NodeEntitiesInfo_",
        {
            "node_namespace": t.bounded_str[256],
            "node_name": t.bounded_str[256],
            "reader_gid_seq": t.sequence[gid],
            "writer_gid_seq": t.sequence[gid],
        },
    )
    info = make_idl_struct(
        "ParticipantEntitiesInfo_",
        f"{prefix}ParticipantEntitiesInfo_",
        {"gid": gid, "node_entities_info_seq": t.sequence[node]},
    )
    return info, node, gid


def gid_bytes(guid: Any, distro: str) -> list[int]:
    """A DDS entity's GUID (``uuid.UUID``) as a GID of ``distro``: its 16 bytes, zero-padded."""
    raw = bytes(guid.bytes)
    return list(raw) + [0] * (GID_SIZE[distro] - len(raw))


def entities_info(
    distro: str, participant_guid: Any, namespace: str, node_name: str, reader_guids: list[Any], writer_guids: list[Any]
) -> Any:
    """One ``ParticipantEntitiesInfo`` sample with a single node."""
    info, node, gid = participant_entities_info(distro)
    return info(
        gid=gid(data=gid_bytes(participant_guid, distro)),
        node_entities_info_seq=[
            node(
                node_namespace="/" + namespace.strip("/"),
                node_name=node_name,
                reader_gid_seq=[gid(data=gid_bytes(g, distro)) for g in reader_guids],
                writer_gid_seq=[gid(data=gid_bytes(g, distro)) for g in writer_guids],
            )
        ],
    )
