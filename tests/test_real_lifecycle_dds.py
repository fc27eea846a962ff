"""Lifecycle (managed-node) services of the DDS-mode node, over real Cyclone DDS on loopback.

The client here is a stand-in for a ROS 2 client on rmw_cyclonedds_cpp (no ROS 2 install runs
in this suite): a plain Cyclone DDS participant written to that rmw's request/reply convention
(``rq/<service>Request`` / ``rr/<service>Reply`` topics, ``<pkg>::srv::dds_::<Srv>_Request_``
types, the 16-byte ``{uint64 guid; int64 seq}`` header before the fields, replies matched by
guid). Its limits: it checks the convention as documented in rmw_cyclonedds' source, not the
real rcl client (XTypes type-information matching, the ``clientid``/``serviceid`` user data
pairing of newer rmw versions, ``ros2 lifecycle``'s own node lookup); the payloads are
additionally decoded with rosbags' ``lifecycle_msgs`` definitions, independent of Cyclone.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from real_support import export_policy, free_domain_id, quad_robot, quad_spec

from embodied.real import messages
from embodied.real.lifecycle import ACTIVE, FINALIZED, INACTIVE, UNCONFIGURED, Lifecycle, serve_lifecycle
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.transports.dds import DdsTransport
from embodied.real.transports.dds_services import HEADER_FIELDS, register_service_types, service_topics, to_wire

NODE = "embodied_policy"


def test_state_machine_follows_lifecycle_msgs() -> None:
    calls: list[Any] = []
    machine = Lifecycle(calls.append, lambda: calls.append("finalized"))
    assert machine.state == UNCONFIGURED and [t.label for t in machine.available()] == ["configure", "shutdown"]
    assert not machine.change(3)  # activate is not available while unconfigured
    assert machine.change(0, "configure") and machine.state == INACTIVE and calls == []
    assert machine.change(3) and machine.state == ACTIVE and calls == [True]
    assert machine.change(4) and machine.state == INACTIVE and calls == [True, False]
    assert machine.change(0, "shutdown") and machine.state == FINALIZED and calls[-1] == "finalized"
    assert machine.available() == [] and not machine.change(1)
    with pytest.raises(ValueError, match="initial lifecycle state"):
        Lifecycle(calls.append, lambda: None, initial=FINALIZED)


class StandInClient:
    """A service client in rmw_cyclonedds_cpp's convention (see the module docstring)."""

    def __init__(self, domain: int, service: str, service_type: str, guid: int) -> None:
        from cyclonedds.core import Qos
        from cyclonedds.domain import DomainParticipant
        from cyclonedds.pub import DataWriter
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        from embodied.real.transports.dds import _qos
        from embodied.real.transports.dds_services import wire_struct

        self.request_type, self.response_type = register_service_types(service_type)
        rq, rr = service_topics(service)
        self.participant = DomainParticipant(domain)
        qos: Qos = _qos("reliable")
        self.request_topic = Topic(self.participant, rq, wire_struct(self.request_type))
        self.writer = DataWriter(self.participant, self.request_topic, qos=qos)
        self.reader = DataReader(
            self.participant, Topic(self.participant, rr, wire_struct(self.response_type)), qos=qos
        )
        self.guid, self.seq = guid, 0
        self.sent: list[bytes] = []
        self.received: list[bytes] = []

    def wait_for_service(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (
                self.writer.get_publication_matched_status().current_count
                and self.reader.get_subscription_matched_status().current_count
            ):
                return
            time.sleep(0.01)
        raise AssertionError("service not available")

    def call(self, values: dict[str, Any], timeout_s: float = 10.0) -> Any:
        self.seq += 1
        request = to_wire(self.request_type, values, self.guid, self.seq)
        self.sent.append(request.serialize())
        self.writer.write(request)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sample in self.reader.take(N=16):
                # rmw_cyclonedds keeps only replies with its own guid (and matches them by seq).
                if getattr(sample, HEADER_FIELDS[0]) == self.guid and getattr(sample, HEADER_FIELDS[1]) == self.seq:
                    self.received.append(sample.serialize())
                    return sample
            time.sleep(0.005)
        raise AssertionError(f"no reply to request {self.seq}")


def _rosbags_decode(payload: bytes, type_name: str) -> Any:
    """Decode a request/reply payload with rosbags: encapsulation header, skip rmw's 16 bytes."""
    assert payload[:4] == b"\x00\x01\x00\x00"  # XCDR1, little endian
    return messages.typestore().deserialize_cdr(payload[:4] + payload[20:], type_name)


def test_ros2_lifecycle_services_over_dds(tmp_path: Path) -> None:
    domain = free_domain_id()
    export = export_policy(tmp_path / "export", quad_spec(history=2), seed=1)
    transport = DdsTransport(domain_id=domain, loopback=True, node_name=NODE)
    node = PolicyNode(transport, load_robot(quad_robot()), PolicyRunner(export), active=False)
    stop = threading.Event()
    finalized = threading.Event()

    def on_finalized() -> None:
        node.shutdown("lifecycle shutdown")
        finalized.set()

    machine = Lifecycle(lambda a: node.activate() if a else node.deactivate("lifecycle deactivate"), on_finalized)
    servers = serve_lifecycle(transport, machine)
    events: list[Any] = []
    watch = DdsTransport(domain_id=domain, loopback=True)
    watch.subscribe(f"/{NODE}/transition_event", "lifecycle_msgs/msg/TransitionEvent", "reliable", events.append)
    change = StandInClient(domain, f"/{NODE}/change_state", "lifecycle_msgs/srv/ChangeState", guid=0x0102030405060708)
    get = StandInClient(domain, f"/{NODE}/get_state", "lifecycle_msgs/srv/GetState", guid=0x1111)
    listing = StandInClient(
        domain, f"/{NODE}/get_available_transitions", "lifecycle_msgs/srv/GetAvailableTransitions", guid=0x2222
    )
    try:
        assert change.request_topic.typename == "lifecycle_msgs::srv::dds_::ChangeState_Request_"
        assert change.request_topic.name == f"rq/{NODE}/change_stateRequest"
        for client in (change, get, listing):
            client.wait_for_service()
        assert get.call({}).current_state.label == "unconfigured"
        labels = [d.transition.label for d in listing.call({}).available_transitions]
        assert labels == ["configure", "shutdown"]
        # As `ros2 lifecycle set NODE activate` does: by label (id from the listing).
        assert change.call({"transition": {"id": 3, "label": "activate"}}).success is False
        assert change.call({"transition": {"id": 1, "label": "configure"}}).success is True
        assert not node.active
        assert change.call({"transition": {"id": 3, "label": "activate"}}).success is True
        assert node.active and machine.state == ACTIVE
        state = get.call({}).current_state
        assert (state.id, state.label) == (ACTIVE, "active")
        assert change.call({"transition": {"id": 4, "label": "deactivate"}}).success is True and not node.active
        assert change.call({"transition": {"id": 6, "label": "shutdown"}}).success is True
        assert finalized.wait(5.0) and machine.state == FINALIZED
        # Replies carried the request's header; the payloads decode with rosbags' definitions.
        request = _rosbags_decode(change.sent[1], "lifecycle_msgs/srv/ChangeState_Request")
        assert (request.transition.id, request.transition.label) == (1, "configure")
        assert _rosbags_decode(change.received[1], "lifecycle_msgs/srv/ChangeState_Response").success is True
        assert int.from_bytes(change.received[1][4:12], "little") == change.guid
        assert int.from_bytes(change.received[1][12:20], "little", signed=True) == 2
        reply = _rosbags_decode(get.received[-1], "lifecycle_msgs/srv/GetState_Response")
        assert reply.current_state.label == "active"
        assert sum(s.requests_served for s in servers) == 8  # 5 change, 2 get, 1 list
        deadline = time.monotonic() + 5.0
        while len(events) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [e.transition.label for e in events] == ["configure", "activate", "deactivate", "shutdown"]
    finally:
        stop.set()
        for client in (change, get, listing):
            client.participant = None  # type: ignore[assignment]
        watch.close()
        transport.close()
