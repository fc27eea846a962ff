"""ROS 2 services over Cyclone DDS, in rmw_cyclonedds_cpp's request/reply wire convention.

What a ROS 2 client (``ros2 lifecycle set``, rclpy, rclcpp) on ``rmw_cyclonedds_cpp`` expects
from a server, as that rmw implements it (``rmw_cyclonedds_cpp/src/rmw_node.cpp``,
``serdata.hpp``, ``ServiceTypeSupport_impl.hpp``, ``namespace_prefix.hpp``; see
docs/conventions.md for the citation):

- Service ``/ns/node/change_state`` of type ``lifecycle_msgs/srv/ChangeState`` is two DDS topics:
  requests on ``rq/ns/node/change_stateRequest`` (DDS type
  ``lifecycle_msgs::srv::dds_::ChangeState_Request_``), replies on
  ``rr/ns/node/change_stateReply`` (``..._Response_``).
- Every request and reply payload starts with the 16-byte header ``cdds_request_header_t``
  ``{uint64 guid; int64 seq}`` before the CDR of the request/response fields. The client puts
  its request writer's instance handle in ``guid`` and a counter in ``seq``; the server copies
  both into the reply, and the client keeps only replies carrying its own ``guid``.
- QoS: ``rmw_qos_profile_services_default`` (reliable, volatile, keep last 10).
- A client counts the server as available when a request reader and a reply writer matched;
  servers that put ``serviceid=...;`` in their USER_DATA are paired exactly, ones without fall
  back to that plain check (this server is one without).

The header is modeled as two leading fields of the DDS struct: with XCDR1 both are 8-byte
aligned at offset 0, so the bytes are the same as rmw's wrapper.

Service types are not in ``rosbags``' store (it holds messages only): the request and response
of each service below are registered there from their ``.srv`` definitions, built on the store's
own ``lifecycle_msgs/msg/*`` definitions. An empty request gets ROS 2's placeholder field
``uint8 structure_needs_at_least_one_member``, as rosidl generates it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from embodied.real import messages

log = logging.getLogger(__name__)

EMPTY = "uint8 structure_needs_at_least_one_member"
SERVICE_DEFINITIONS: dict[str, tuple[str, str]] = {
    # lifecycle_msgs/srv/*.srv: (request, response) fields.
    "lifecycle_msgs/srv/ChangeState": ("lifecycle_msgs/Transition transition", "bool success"),
    "lifecycle_msgs/srv/GetState": (EMPTY, "lifecycle_msgs/State current_state"),
    "lifecycle_msgs/srv/GetAvailableTransitions": (
        EMPTY,
        "lifecycle_msgs/TransitionDescription[] available_transitions",
    ),
}
HEADER_FIELDS = ("_rmw_guid", "_rmw_seq")
"""Names given here to ``cdds_request_header_t``'s ``guid`` and ``seq`` in the DDS structs."""


@cache
def register_service_types(service_type: str) -> tuple[str, str]:
    """Register ``<srv>_Request`` and ``<srv>_Response`` with the message store; their names."""
    from rosbags.typesys import get_types_from_msg

    if service_type not in SERVICE_DEFINITIONS:
        raise ValueError(f"unknown service type {service_type!r}; known: {', '.join(SERVICE_DEFINITIONS)}")
    names = (f"{service_type}_Request", f"{service_type}_Response")
    store = messages.typestore()
    for name, text in zip(names, SERVICE_DEFINITIONS[service_type], strict=True):
        if name not in store.fielddefs:
            # rosbags files every parsed type under pkg/msg/; the key is the service part's name.
            (definition,) = get_types_from_msg(text, name).values()
            store.register({name: definition})
    return names


@cache
def wire_struct(type_name: str) -> Any:
    """Cyclone struct of a service request/response: the rmw header, then the fields."""
    from cyclonedds.idl import make_idl_struct, types

    from embodied.real.transports.dds import _idl_field

    annotations: dict[str, Any] = {HEADER_FIELDS[0]: types.uint64, HEADER_FIELDS[1]: types.int64}
    for name, (kind, spec) in messages.fields(type_name):
        annotations[name] = _idl_field(kind, spec)
    return make_idl_struct(type_name.rsplit("/", 1)[1] + "_", messages.dds_type_name(type_name), annotations)


def service_topics(service: str) -> tuple[str, str]:
    """Absolute ROS 2 service name -> ``(request topic, reply topic)`` on DDS."""
    name = service.lstrip("/")
    return f"rq/{name}Request", f"rr/{name}Reply"


def to_wire(type_name: str, values: dict[str, Any], guid: int, seq: int) -> Any:
    """A request/response struct from nested field ``values`` and the rmw header."""
    from embodied.real.transports.dds import idl_struct

    def build(name: str, fields: dict[str, Any]) -> Any:
        if name == type_name:
            return wire_struct(type_name)(**{HEADER_FIELDS[0]: guid, HEADER_FIELDS[1]: seq}, **fields)
        return idl_struct(name)(**fields)

    return messages.convert(messages.make(type_name, values), type_name, build)


Handler = Callable[[Any], dict[str, Any]]
"""Request sample (attributes as the request's fields) -> response field values."""


class DdsService:
    """One service server on a Cyclone participant; replies from the listener thread."""

    def __init__(self, participant: Any, service: str, service_type: str, handler: Handler, qos: Any) -> None:
        from cyclonedds.core import Listener
        from cyclonedds.pub import DataWriter
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        self.service = service
        self.request_type, self.response_type = register_service_types(service_type)
        request_topic, reply_topic = service_topics(service)
        self.requests_served = 0
        self._handler = handler
        self.writer = DataWriter(participant, Topic(participant, reply_topic, wire_struct(self.response_type)), qos=qos)
        self.reader = DataReader(
            participant,
            Topic(participant, request_topic, wire_struct(self.request_type)),
            qos=qos,
            listener=Listener(on_data_available=self._on_request),
        )

    def _on_request(self, reader: Any) -> None:
        try:
            samples = reader.take(N=16)
        except Exception as err:  # a malformed request must not kill the listener thread
            log.error("dropped undecodable request(s) on %s: %s", self.service, err)
            return
        for sample in samples:
            if not getattr(sample.sample_info, "valid_data", True):
                continue
            try:
                values = self._handler(sample)
                reply = to_wire(
                    self.response_type, values, getattr(sample, HEADER_FIELDS[0]), getattr(sample, HEADER_FIELDS[1])
                )
                self.writer.write(reply)
                self.requests_served += 1
            except Exception as err:
                log.error("service %s failed to answer: %s", self.service, err)
