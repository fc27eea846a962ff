"""Cyclone DDS transport that speaks ROS 2's wire conventions without a ROS 2 install.

ROS 2 nodes using ``rmw_cyclonedds_cpp`` see the topics and types published here as their own:
the DDS topic is ``rt/<ros topic>``, the DDS type ``<pkg>::msg::dds_::<Type>_``, the payload
plain CDR (XCDR1, little endian). The Cyclone DDS structs are generated at run time from
``rosbags``' ROS 2 message definitions, and tests check their serialization byte for byte
against ``rosbags``' CDR serializer.

Process-wide: Cyclone DDS reads its configuration once per domain; :func:`loopback_config`
pins traffic to ``lo`` (no multicast, peer 127.0.0.1) for tests and single-machine loops.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.messages import ARRAY, BASE, NAME
from embodied.real.transports import MAX_DOMAIN_ID, MessageCallback, Publish, qos_profile, resolve_topic
from embodied.real.transports.discovery import DEFAULT_DISTRO, DISCOVERY_TOPIC, entities_info, participant_entities_info

log = logging.getLogger(__name__)

LOOPBACK_CONFIG_FILE = Path(__file__).with_name("cyclonedds_loopback.xml")
"""The same loopback pinning as a file, for ``CYCLONEDDS_URI=file://...`` in ROS 2 shells."""


def loopback_config() -> str:
    """Cyclone DDS XML that keeps all traffic on the loopback interface."""
    return LOOPBACK_CONFIG_FILE.read_text()


_LOOPBACK_DOMAINS: dict[int, Any] = {}
_DOMAINS_LOCK = threading.Lock()


def _idl_types() -> Any:
    # Typed as Any: Cyclone's generic markers (array[T, N], sequence[T]) are subscripted at
    # run time in a way its stubs do not declare.
    from cyclonedds.idl import types

    return types


def _idl_base(base: str, bound: int) -> Any:
    t = _idl_types()

    if base == "string":
        return t.bounded_str[bound] if bound else str
    table: dict[str, Any] = {
        "bool": bool,
        "byte": t.byte,
        "octet": t.byte,
        "char": t.uint8,  # ROS 2 maps char to uint8 on the wire
        "int8": t.int8,
        "uint8": t.uint8,
        "int16": t.int16,
        "uint16": t.uint16,
        "int32": t.int32,
        "uint32": t.uint32,
        "int64": t.int64,
        "uint64": t.uint64,
        "float32": t.float32,
        "float64": t.float64,
    }
    return table[base]


def _idl_field(kind: int, spec: Any) -> Any:
    t = _idl_types()

    if kind == BASE:
        return _idl_base(*spec)
    if kind == NAME:
        return idl_struct(spec)
    (item_kind, item_spec), length = spec
    item = _idl_field(item_kind, item_spec)
    if kind == ARRAY:
        return t.array[item, length]
    return t.sequence[item, length] if length else t.sequence[item]


@cache
def idl_struct(type_name: str) -> Any:
    """The Cyclone DDS struct class of ROS 2 message ``pkg/msg/Type``, from its definition."""
    from cyclonedds.idl import make_idl_struct

    annotations = {name: _idl_field(kind, spec) for name, (kind, spec) in messages.fields(type_name)}
    return make_idl_struct(type_name.rsplit("/", 1)[1] + "_", messages.dds_type_name(type_name), annotations)


def to_idl(message: Any, type_name: str) -> Any:
    """Convert a ``rosbags`` message into an instance of :func:`idl_struct` ``(type_name)``."""
    return messages.convert(message, type_name, lambda name, values: idl_struct(name)(**values))


def _qos(name: str, deadline_s: float | None = None) -> Any:
    from cyclonedds.core import Policy, Qos
    from cyclonedds.util import duration

    profile = qos_profile(name)
    reliability = (
        Policy.Reliability.Reliable(max_blocking_time=duration(milliseconds=100))
        if profile.reliable
        else Policy.Reliability.BestEffort
    )
    durability = Policy.Durability.TransientLocal if profile.transient_local else Policy.Durability.Volatile
    policies = [reliability, Policy.History.KeepLast(profile.depth), durability]
    if deadline_s is not None:
        policies.append(Policy.Deadline(round(deadline_s * 1e9)))
    return Qos(*policies)


CLOSE_ACK_TIMEOUT_S = 0.5
""":meth:`DdsTransport.close` waits at most this long, over all writers together, for matched
reliable readers to acknowledge what was written last (the final safe command)."""


class DdsTransport:
    """A Cyclone DDS participant with ROS 2 naming. Callbacks run on Cyclone's listener thread.

    ``domain_id`` defaults to ``$ROS_DOMAIN_ID`` (else 0), like ROS 2. ``loopback=True`` pins
    the domain to ``lo``; otherwise Cyclone uses ``$CYCLONEDDS_URI`` or its defaults.
    """

    def __init__(
        self,
        domain_id: int | None = None,
        loopback: bool = False,
        namespace: str = "",
        node_name: str = "",
        ros_distro: str = DEFAULT_DISTRO,
    ) -> None:
        from cyclonedds.domain import Domain, DomainParticipant

        self.namespace, self.node_name = namespace, node_name or "embodied"
        self.ros_distro = ros_distro
        self._announce_node = bool(node_name)
        """Publish ``ros_discovery_info`` (:mod:`.discovery`) so ROS 2 tools list the node."""
        self._discovery_writer: Any = None
        self._reader_guids: list[Any] = []
        self._writer_guids: list[Any] = []

        if domain_id is None:
            text = os.environ.get("ROS_DOMAIN_ID", "0").strip() or "0"
            if not text.isdigit() or int(text) > MAX_DOMAIN_ID:
                raise EmbodiedError(f"ROS_DOMAIN_ID={text!r}: expected an integer in [0, {MAX_DOMAIN_ID}]")
            domain_id = int(text)
        self.domain_id = domain_id
        if loopback:
            with _DOMAINS_LOCK:
                # Cyclone accepts one configuration per domain and process; the Domain object
                # must outlive every participant in it, so it is kept for the process lifetime.
                if domain_id not in _LOOPBACK_DOMAINS:
                    _LOOPBACK_DOMAINS[domain_id] = Domain(domain_id, loopback_config())
        self._participant: Any = DomainParticipant(domain_id)
        self._topics: dict[str, Any] = {}
        self._entities: list[Any] = []
        self._writers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.decode_errors = 0
        """Samples dropped because they could not be deserialized (malformed payloads)."""
        self._decode_logged: set[str] = set()

    def _count_decode_error(self, topic: str, type_name: str, err: Exception) -> None:
        """Count a sample Cyclone delivered but Python could not decode (e.g. a string that is not
        UTF-8); the first per topic is logged. CDR that Cyclone's own validation rejects (truncated,
        lengths past the end) is dropped below this layer and never reaches a reader."""
        with self._lock:
            self.decode_errors += 1
            first = topic not in self._decode_logged
            self._decode_logged.add(topic)
        if first:
            log.error(
                "dropped an undecodable sample on %s (%s): %s; further ones are counted on /diagnostics "
                "as decode_errors",
                topic,
                type_name,
                err,
            )

    def resolve(self, topic: str) -> str:
        """The absolute ROS 2 name of ``topic`` in this transport's namespace."""
        return resolve_topic(topic, self.namespace, self.node_name)

    def _topic(self, topic: str, type_name: str) -> Any:
        from cyclonedds.topic import Topic

        key = messages.dds_topic_name(self.resolve(topic))
        with self._lock:
            if key not in self._topics:
                self._topics[key] = Topic(self._participant, key, idl_struct(type_name))
            return self._topics[key]

    def subscribe(
        self,
        topic: str,
        type_name: str,
        qos: str,
        callback: MessageCallback,
        on_publishers_lost: Callable[[], None] | None = None,
    ) -> None:
        """``on_publishers_lost`` is called when the last matched writer leaves (its participant
        closed, or its lease expired after a crash): faster than any timeout."""
        from cyclonedds.core import Listener
        from cyclonedds.sub import DataReader

        def on_data_available(reader: Any) -> None:
            # One sample per take: an undecodable one then costs only itself, and each is counted.
            for _ in range(64):
                if self._participant is None:  # closing: the reader is being deleted under us
                    return
                try:
                    samples = reader.take(N=1)
                except Exception as err:  # a malformed payload must not kill the listener thread
                    self._count_decode_error(topic, type_name, err)
                    continue
                if not samples:
                    return
                for sample in samples:
                    if getattr(sample.sample_info, "valid_data", True):
                        callback(sample)

        def on_subscription_matched(_reader: Any, status: Any) -> None:
            if on_publishers_lost is not None and status.current_count == 0 and status.current_count_change < 0:
                on_publishers_lost()

        reader = DataReader(
            self._participant,
            self._topic(topic, type_name),
            qos=_qos(qos),
            listener=Listener(on_data_available=on_data_available, on_subscription_matched=on_subscription_matched),
        )
        self._entities.append(reader)
        self._reader_guids.append(reader.guid)
        self._announce()

    def publisher(self, topic: str, type_name: str, qos: str, deadline_s: float | None = None) -> Publish:
        """``deadline_s``: the DEADLINE QoS offered (the longest gap between two samples this
        writer promises); readers requesting a deadline at least this long match, and are told
        by their middleware when it passes without a sample."""
        from cyclonedds.pub import DataWriter

        writer = DataWriter(self._participant, self._topic(topic, type_name), qos=_qos(qos, deadline_s))
        self._entities.append(writer)
        self._writer_guids.append(writer.guid)
        self._announce()
        convert: Callable[[Any, str], Any] = to_idl

        def publish(message: Any) -> None:
            writer.write(convert(message, type_name))

        self._writers[id(publish)] = writer
        return publish

    def serve(self, service: str, service_type: str, handler: Callable[[Any], dict[str, Any]]) -> Any:
        """A ROS 2 service server (rmw_cyclonedds_cpp's request/reply convention, see
        :mod:`.dds_services`) named ``service`` (``~/change_state`` resolves under the node);
        ``handler(request) -> response field values`` runs on Cyclone's listener thread."""
        from embodied.real.transports.dds_services import DdsService

        server = DdsService(self._participant, self.resolve(service), service_type, handler, _qos("reliable"))
        self._entities += [server.reader, server.writer]
        self._reader_guids.append(server.reader.guid)
        self._writer_guids.append(server.writer.guid)
        self._announce()
        return server

    def _announce(self) -> None:
        """(Re)publish this participant's node and its readers/writers on ``ros_discovery_info``."""
        if not self._announce_node:
            return
        from cyclonedds.pub import DataWriter
        from cyclonedds.topic import Topic

        if self._discovery_writer is None:
            info_type = participant_entities_info(self.ros_distro)[0]
            topic = Topic(self._participant, DISCOVERY_TOPIC, info_type)
            self._discovery_writer = DataWriter(self._participant, topic, qos=_qos("latched"))
            self._entities.append(self._discovery_writer)
        self._discovery_writer.write(
            entities_info(
                self.ros_distro,
                self._participant.guid,
                self.namespace,
                self.node_name,
                self._reader_guids,
                self._writer_guids,
            )
        )

    def flush(self, timeout_s: float = CLOSE_ACK_TIMEOUT_S) -> bool:
        """Block until every matched reliable reader acknowledged every publisher's samples, or
        ``timeout_s`` passed (shared by all writers); ``True`` when all were acknowledged."""
        if self._participant is None:
            return True
        deadline = time.monotonic() + timeout_s
        acknowledged = True
        for writer in list(self._writers.values()):
            remaining_ns = max(0, round((deadline - time.monotonic()) * 1e9))
            try:
                acknowledged = bool(writer.wait_for_acks(remaining_ns)) and acknowledged
            except Exception as err:  # a writer already deleted by a failing peer: nothing to wait for
                log.debug("wait_for_acks: %s", err)
        if not acknowledged:
            log.warning("closing: not every matched reader acknowledged within %.0f ms", timeout_s * 1e3)
        return acknowledged

    def wait_for_subscribers(self, publish: Publish, count: int = 1, timeout_s: float = 5.0) -> bool:
        """Block until the writer behind ``publish`` has matched ``count`` readers (discovery)."""
        writer = self._writers[id(publish)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if writer.get_publication_matched_status().current_count >= count:
                return True
            time.sleep(0.005)
        return False

    def close(self, ack_timeout_s: float = CLOSE_ACK_TIMEOUT_S) -> None:
        """Wait (at most ``ack_timeout_s`` in all) until matched reliable readers acknowledged
        everything written, so the last command is not lost with the participant; then delete the
        participant (and its readers and writers) now, so peers see them leave at once: garbage
        collection alone would wait for every closure holding a writer."""
        self.flush(ack_timeout_s)
        participant, self._participant = self._participant, None
        self._entities.clear()
        self._writers.clear()
        self._topics.clear()
        self._discovery_writer = None
        if participant is not None:
            ref = participant._ref
            # Cyclone's own deletion (dds_delete, recursive); dropped from its registry first so the
            # Python objects' finalizers do not delete the handle a second time.
            participant._entities.pop(ref, None)
            participant._delete(ref)
