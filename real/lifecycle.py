"""The ROS 2 managed-node (lifecycle) state machine of the DDS-mode node.

Primary states and transitions with the ids and labels of ``lifecycle_msgs/msg/State`` and
``lifecycle_msgs/msg/Transition`` (the values ``ros2 lifecycle`` sends and prints):

    unconfigured --configure--> inactive --activate--> active
    inactive --cleanup--> unconfigured;  active --deactivate--> inactive
    unconfigured | inactive | active --shutdown--> finalized

The node has loaded its policy and subscribed before the machine exists (the resources a
``configure`` would allocate), so configure and cleanup change only the state; what matters for
the robot is that the policy drives only in ``active`` (:meth:`PolicyNode.activate`) and every
other state sends the safe command (:meth:`PolicyNode.deactivate`); ``shutdown`` ends the node
with its final safe command. Transitions run at once (no intermediate ``configuring`` etc.
states are reported, as rclcpp reports them only while a callback runs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# lifecycle_msgs/msg/State primary state ids.
UNKNOWN, UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = 0, 1, 2, 3, 4
STATE_LABELS = {UNKNOWN: "unknown", UNCONFIGURED: "unconfigured", INACTIVE: "inactive", ACTIVE: "active"}
STATE_LABELS[FINALIZED] = "finalized"

# lifecycle_msgs/msg/Transition ids.
CONFIGURE, CLEANUP, ACTIVATE, DEACTIVATE = 1, 2, 3, 4
UNCONFIGURED_SHUTDOWN, INACTIVE_SHUTDOWN, ACTIVE_SHUTDOWN = 5, 6, 7


@dataclass(frozen=True)
class Transition:
    """One edge of the machine: ``id``/``label`` as in ``lifecycle_msgs/msg/Transition``."""

    id: int
    label: str
    start: int
    goal: int


TRANSITIONS: tuple[Transition, ...] = (
    Transition(CONFIGURE, "configure", UNCONFIGURED, INACTIVE),
    Transition(CLEANUP, "cleanup", INACTIVE, UNCONFIGURED),
    Transition(ACTIVATE, "activate", INACTIVE, ACTIVE),
    Transition(DEACTIVATE, "deactivate", ACTIVE, INACTIVE),
    Transition(UNCONFIGURED_SHUTDOWN, "shutdown", UNCONFIGURED, FINALIZED),
    Transition(INACTIVE_SHUTDOWN, "shutdown", INACTIVE, FINALIZED),
    Transition(ACTIVE_SHUTDOWN, "shutdown", ACTIVE, FINALIZED),
)


class Lifecycle:
    """Current state plus the hooks a transition into ``active``, out of it, or to ``finalized`` runs.

    ``on_active(True)`` enters ``active``, ``on_active(False)`` leaves it; ``on_finalized()`` ends
    the node. Thread-safe: service requests arrive on middleware threads.
    """

    def __init__(
        self,
        on_active: Callable[[bool], None],
        on_finalized: Callable[[], None],
        initial: int = UNCONFIGURED,
    ) -> None:
        if initial not in (UNCONFIGURED, INACTIVE, ACTIVE):
            raise ValueError(f"initial lifecycle state must be unconfigured, inactive or active, got {initial}")
        self.state = initial
        self._on_active = on_active
        self._on_finalized = on_finalized
        self._lock = threading.Lock()
        self.on_transition: Callable[[Transition], None] | None = None
        """Called after every completed transition (e.g. to publish ``~/transition_event``)."""

    @property
    def label(self) -> str:
        return STATE_LABELS[self.state]

    def available(self) -> list[Transition]:
        """Transitions that start from the current state (``get_available_transitions``)."""
        return [t for t in TRANSITIONS if t.start == self.state]

    def change(self, transition_id: int, label: str = "") -> bool:
        """Run the transition named by ``transition_id`` (or by ``label`` when the id is 0, as
        rclcpp accepts); False when it does not start from the current state."""
        with self._lock:
            match = [
                t
                for t in self.available()
                if (t.id == transition_id if transition_id else t.label == label) and transition_id >= 0
            ]
            if not match:
                log.warning(
                    "lifecycle: transition %s not available in state %s", transition_id or repr(label), self.label
                )
                return False
            transition = match[0]
            before = self.state
            self.state = transition.goal
        log.info("lifecycle: %s -> %s (%s)", STATE_LABELS[before], self.label, transition.label)
        if transition.goal == ACTIVE:
            self._on_active(True)
        elif before == ACTIVE and transition.goal == INACTIVE:
            self._on_active(False)
        elif transition.goal == FINALIZED:
            self._on_finalized()
        if self.on_transition is not None:
            self.on_transition(transition)
        return True


def serve_lifecycle(transport: Any, lifecycle: Lifecycle) -> list[Any]:
    """Offer ``~/change_state``, ``~/get_state`` and ``~/get_available_transitions`` (the
    services ``ros2 lifecycle set/get/list`` call) and publish ``~/transition_event`` on a
    transport with ``serve`` (:class:`~embodied.real.transports.dds.DdsTransport`)."""
    from embodied.real import messages

    def state(state_id: int) -> dict[str, Any]:
        return {"id": state_id, "label": STATE_LABELS[state_id]}

    def describe(t: Transition) -> dict[str, Any]:
        return {
            "transition": {"id": t.id, "label": t.label},
            "start_state": state(t.start),
            "goal_state": state(t.goal),
        }

    def change_state(request: Any) -> dict[str, Any]:
        return {"success": lifecycle.change(int(request.transition.id), str(request.transition.label))}

    publish_event = transport.publisher("~/transition_event", "lifecycle_msgs/msg/TransitionEvent", "reliable")

    def on_transition(t: Transition) -> None:
        event = {"timestamp": time.time_ns(), **describe(t)}
        publish_event(messages.make("lifecycle_msgs/msg/TransitionEvent", event))

    lifecycle.on_transition = on_transition
    return [
        transport.serve("~/change_state", "lifecycle_msgs/srv/ChangeState", change_state),
        transport.serve(
            "~/get_state", "lifecycle_msgs/srv/GetState", lambda _r: {"current_state": state(lifecycle.state)}
        ),
        transport.serve(
            "~/get_available_transitions",
            "lifecycle_msgs/srv/GetAvailableTransitions",
            lambda _r: {"available_transitions": [describe(t) for t in lifecycle.available()]},
        ),
    ]
