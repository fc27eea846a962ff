"""The deployment node: cached inputs -> observation -> policy -> safety -> command message.

Middleware callbacks only cache the newest message of each input (and its arrival time);
every control period the node assembles the observation, runs the policy, filters the
action through the safety layer and publishes. Bad data never stops the node: it logs what
is wrong (rate-limited) and commands the robot's safe command until inputs are valid again
and the re-arm rule is met. The same class runs over Cyclone DDS and rclpy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from embodied.config import ConfigError
from embodied.real import messages
from embodied.real.control_loop import Clock, ControlLoop, LoopStats
from embodied.real.observation import ObservationBuilder, ObservationError, Signal, compile_signal
from embodied.real.robot_config import RobotConfig
from embodied.real.runner import PolicyRunner
from embodied.real.safety import SafetyLayer, SafetyState
from embodied.real.transports import Transport

log = logging.getLogger(__name__)

ERROR_LOG_INTERVAL_S = 1.0
"""Repeat an unchanged error message in the log at most this often."""


def command_message(type_name: str, path: str, values: np.ndarray, layout_label: str = "") -> Any:
    """The output message with ``values`` written at dotted ``path`` (and a layout dimension)."""
    nested: dict[str, Any] = {}
    node = nested
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = values
    if layout_label:
        n = len(values)
        nested["layout"] = {"dim": [{"label": layout_label, "size": n, "stride": n}]}
    return messages.make(type_name, nested)


class PolicyNode:
    """Runs one exported policy on one robot over ``transport``."""

    def __init__(
        self,
        transport: Transport,
        robot: RobotConfig,
        runner: PolicyRunner,
        clock: Clock = time.monotonic,
        period_s: float | None = None,
    ) -> None:
        self.robot = robot
        self.runner = runner
        self.io_spec = runner.io_spec
        self.period_s = float(period_s or self.io_spec.control_period_s)
        self._clock = clock
        self.builder = ObservationBuilder(robot, self.io_spec)
        self.safety = SafetyLayer(self.io_spec, robot.safety, self.period_s, source=str(robot.path))
        self._hold: Signal | None = (
            compile_signal(robot, robot.safety.hold, "safety.hold") if robot.safety.hold is not None else None
        )
        triggers = [i.name for i in robot.inputs.values() if i.trigger]
        if robot.trigger == "input" and not triggers:
            raise ConfigError(f"{robot.path}: trigger: input needs one input with `trigger: true`")
        self._latency_input = triggers[0] if triggers else next(iter(robot.inputs))
        self._lock = threading.Lock()
        self._latest: dict[str, Any] = {}
        self._arrival_s: dict[str, float] = {}
        self.received: dict[str, int] = dict.fromkeys(robot.inputs, 0)
        """Messages received per input."""
        self._unanswered_since: float | None = None
        self.trigger_event = threading.Event() if robot.trigger == "input" else None
        self.error_count = 0
        self.last_error = ""
        self._last_error_log = (-1e9, "")
        for cfg in robot.inputs.values():
            transport.subscribe(cfg.topic, cfg.type, cfg.qos, self._cache(cfg.name))
        if robot.safety.estop_topic:
            transport.subscribe(robot.safety.estop_topic, "std_msgs/msg/Bool", "reliable", self._on_estop)
        self._publish = transport.publisher(robot.command.topic, robot.command.type, robot.command.qos)
        self._transport = transport
        self.loop = ControlLoop(self.period_s, self.step, self.trigger_event, clock)
        self.commands_sent = 0
        self._last_hold: np.ndarray | None = None

    def _cache(self, name: str) -> Any:
        def on_message(message: Any) -> None:
            now = self._clock()
            with self._lock:
                self._latest[name] = message
                self._arrival_s[name] = now
                self.received[name] += 1
                if name == self._latency_input and self._unanswered_since is None:
                    self._unanswered_since = now
            if self.trigger_event is not None and name == self._latency_input:
                self.trigger_event.set()

        return on_message

    def _on_estop(self, message: Any) -> None:
        engaged = bool(getattr(message, "data", True))
        with self._lock:
            self.safety.set_estop(engaged)
        log.warning("e-stop %s", "ENGAGED" if engaged else "released (re-arming)")

    def _report(self, message: str) -> None:
        self.error_count += 1
        self.last_error = message
        now = self._clock()
        last_t, last_msg = self._last_error_log
        if message != last_msg or now - last_t >= ERROR_LOG_INTERVAL_S:
            log.error("%s -> safe command", message)
            self._last_error_log = (now, message)

    def inputs_fresh(self, now_s: float) -> bool:
        """Every input has arrived and none is older than its ``stale_timeout_s``."""
        return all(
            name in self._arrival_s and now_s - self._arrival_s[name] <= cfg.stale_timeout_s
            for name, cfg in self.robot.inputs.items()
        )

    def step(self, now_s: float) -> np.ndarray | None:
        """One control period; returns the published command (physical units) or None."""
        with self._lock:
            latest: Mapping[str, Any] = dict(self._latest)
            fresh = self.inputs_fresh(now_s)
            answered = self._unanswered_since
            self._unanswered_since = None
        if self.trigger_event is not None and answered is None and fresh and self.safety.state is SafetyState.ARMED:
            # Input-triggered and nothing new arrived: this tick exists only for the watchdog,
            # and re-answering an old observation would send a second command for one state.
            return None
        action: np.ndarray | None = None
        if fresh:
            try:
                action = self.runner(self.builder.build(latest))
                if not np.all(np.isfinite(action)):
                    raise ObservationError(f"policy produced non-finite action {action.tolist()}")
            except ObservationError as err:
                action = None
                self._report(str(err))
            except Exception as err:  # a conversion bug must not take the robot down with it
                action = None
                self._report(f"unexpected {type(err).__name__} while building the observation: {err}")
        if self._hold is not None:
            try:
                value = self._hold.read(latest, np.zeros(0))
                # Only a complete, finite reading replaces the held command; otherwise the last
                # valid one stays (a NaN must never reach the robot as a "safe" command).
                if value.shape == (self.io_spec.action_dim,) and np.isfinite(value).all():
                    self._last_hold = value
            except (ObservationError, ValueError, TypeError, AttributeError):
                pass
        hold = self._last_hold
        with self._lock:
            command, armed = self.safety.step(fresh, action, hold)
        if armed and self.safety.sent_action is not None:
            self.builder.history.push(self.safety.sent_action)
        else:
            # The policy always restarts from an empty history, as at the start of an episode.
            self.builder.history.reset()
        if command is None:
            return None
        try:
            cmd = self.robot.command
            self._publish(command_message(cmd.type, cmd.path, command, cmd.layout_label))
        except Exception as err:
            self._report(f"cannot publish on {self.robot.command.topic}: {err}")
            return None
        self.commands_sent += 1
        if answered is not None:
            self.loop.stats.latency_s.append(self._clock() - answered)
        return command

    @property
    def state(self) -> SafetyState:
        return self.safety.state

    def status(self) -> dict[str, Any]:
        """Numbers for a live status line."""
        stats: LoopStats = self.loop.stats
        p50, p90, p99 = stats.percentiles_ms()
        return {
            "state": self.safety.state.value,
            "rate_hz": stats.rate_hz(),
            "latency_ms": (p50, p90, p99),
            "steps": stats.steps,
            "overruns": stats.overruns,
            "commands": self.commands_sent,
            "received": sum(self.received.values()),
            "errors": self.error_count,
            "last_error": self.last_error,
            "decode_errors": int(getattr(self._transport, "decode_errors", 0)),
        }

    def run(self, stop: threading.Event, duration_s: float | None = None, max_steps: int | None = None) -> LoopStats:
        """Run the control loop in this thread until ``stop`` is set (or the limits are hit)."""
        return self.loop.run(stop, max_steps=max_steps, duration_s=duration_s)
