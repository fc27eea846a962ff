"""In-process transport: messages go straight from publisher to subscribers, synchronously.

For tests and single-process simulation: the node logic runs exactly as over DDS, but
delivery is immediate and deterministic (no discovery, no threads).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from embodied.real import messages
from embodied.real.transports import MessageCallback, Publish, qos_profile, resolve_topic


class MemoryTransport:
    """Topic -> callbacks, shared by everyone holding the same instance."""

    def __init__(self, namespace: str = "", node_name: str = "embodied_policy") -> None:
        self.namespace, self.node_name = namespace, node_name
        self._subscribers: dict[str, list[MessageCallback]] = defaultdict(list)
        self._types: dict[str, str] = {}
        self._lost: dict[str, list[Callable[[], None]]] = defaultdict(list)
        self.published: dict[str, list[Any]] = defaultdict(list)
        """Every message published, per resolved topic (for inspection)."""

    def resolve(self, topic: str) -> str:
        return resolve_topic(topic, self.namespace, self.node_name)

    def _check(self, topic: str, type_name: str, qos: str) -> None:
        qos_profile(qos)
        messages.check_type(type_name)
        known = self._types.setdefault(topic, type_name)
        if known != type_name:
            raise ValueError(f"topic {topic} carries {known}, not {type_name}")

    def subscribe(
        self,
        topic: str,
        type_name: str,
        qos: str,
        callback: MessageCallback,
        on_publishers_lost: Callable[[], None] | None = None,
    ) -> None:
        topic = self.resolve(topic)
        if on_publishers_lost is not None:
            self._lost[topic].append(on_publishers_lost)
        self._check(topic, type_name, qos)
        self._subscribers[topic].append(callback)

    def publisher(self, topic: str, type_name: str, qos: str, deadline_s: float | None = None) -> Publish:
        """``deadline_s`` (a DEADLINE QoS) has no meaning in process: accepted and unused."""
        topic = self.resolve(topic)
        self._check(topic, type_name, qos)

        def publish(message: Any) -> None:
            self.published[topic].append(message)
            for callback in list(self._subscribers[topic]):
                callback(message)

        return publish

    def drop_publishers(self, topic: str) -> None:
        """Simulate every publisher of ``topic`` leaving (as DDS reports when a peer exits)."""
        for hook in self._lost[self.resolve(topic)]:
            hook()

    def close(self) -> None:
        self._subscribers.clear()
