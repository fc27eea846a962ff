"""The deployment node: sampled inputs -> observation -> envelope -> policy -> safety -> command.

Middleware callbacks only admit and cache the newest message of each input (see
:mod:`embodied.real.freshness`); the node's own clock runs a control step every trained period,
which assembles the observation, checks it against the training envelope, runs the policy,
filters the action through the safety layer and publishes. Bad data never stops the node: every
rejection is counted by reason, every state change is logged once with its reason and published
on ``/diagnostics`` and the latched ``~/state`` topic, and the robot's safe command is sent until
inputs are valid again and the re-arm rule is met. :meth:`PolicyNode.shutdown` sends the safe
command on every way out (signal, exception, deactivation, parameter change). The same class runs
over Cyclone DDS and rclpy.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from embodied.config import ConfigError
from embodied.real import messages
from embodied.real.camera_image import decode_image
from embodied.real.control_loop import Clock, ControlLoop, LoopStats
from embodied.real.freshness import InputGate, SimClock
from embodied.real.observation import ObservationBuilder, ObservationError, Signal, compile_signal
from embodied.real.robot_config import IMAGE_TYPES, RobotConfig
from embodied.real.runner import DeployRunner
from embodied.real.safety import Envelope, SafetyLayer, SafetyState
from embodied.real.sim_input_wait import PeriodInputWait
from embodied.real.transports import Transport

log = logging.getLogger(__name__)

DIAGNOSTICS_TOPIC = "/diagnostics"
STATE_TOPIC = "~/state"
DIAGNOSTICS_PERIOD_S = 1.0
"""``/diagnostics`` is published this often, and at once on every state change."""
NODE_NAME = "embodied_policy"

# diagnostic_msgs/DiagnosticStatus levels.
OK, WARN, ERROR = 0, 1, 2
_LEVELS = {
    SafetyState.ARMED: OK,
    SafetyState.REARMING: WARN,
    SafetyState.HOLD: WARN,
    SafetyState.WAITING: WARN,
    SafetyState.INACTIVE: WARN,
}


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


def _stamp(seconds: float) -> dict[str, int]:
    return _stamp_ns(round(seconds * 1e9))


def _stamp_ns(ns: int) -> dict[str, int]:
    return {"sec": ns // 1_000_000_000, "nanosec": ns % 1_000_000_000}


class PolicyNode:
    """Runs one exported policy on one robot over ``transport``.

    ``clock`` (monotonic seconds) drives the loop and arrival ages; ``stamp_clock`` (seconds
    since the epoch) is what header stamps are compared with. ``sim_clock`` (``use_sim_time``)
    replaces both: loop, arrival and stamp ages all run on ``/clock``. ``rt_priority``: the
    loop thread's ``SCHED_FIFO`` priority (0: normal scheduling; see :mod:`embodied.real.realtime`).

    Safety events (every publisher of an input left, e-stop engaged, an input gap falling due:
    the loop's watchdog) wake the loop for an extra step at once instead of waiting for the next
    period; that step only ever sends the hold or safe command (the policy runs on its trained
    period only).
    """

    def __init__(
        self,
        transport: Transport,
        robot: RobotConfig,
        runner: DeployRunner,
        clock: Clock = time.monotonic,
        period_s: float | None = None,
        stamp_clock: Callable[[], float] = time.time,
        active: bool = True,
        sim_clock: SimClock | None = None,
        rt_priority: int = 0,
    ) -> None:
        runner.prepare(robot)  # refuses a camera / an instruction the robot cannot feed
        self.robot = robot
        self.runner = runner
        self.io_spec = runner.io_spec
        self.period_s = float(period_s or self.io_spec.control_period_s)
        if sim_clock is not None:
            clock = stamp_clock = sim_clock
        self._clock = clock
        self.stamp_clock = stamp_clock
        self.builder = ObservationBuilder(robot, self.io_spec)
        self.safety = SafetyLayer(self.io_spec, robot.safety, self.period_s, source=str(robot.path))
        self.envelope = Envelope(robot.safety.envelope, self.io_spec, robot.safety.envelope_limits, str(robot.path))
        self._hold: Signal | None = (
            compile_signal(robot, robot.safety.hold, "safety.hold") if robot.safety.hold is not None else None
        )
        self._lock = threading.Lock()
        self._accepted = threading.Condition(self._lock)
        """Notified when an input message is accepted."""
        gap = robot.safety.gap_hold
        gap_s = None if gap is None else gap.after_periods * self.period_s
        cameras = {name for name, cfg in robot.inputs.items() if cfg.type in IMAGE_TYPES}
        watched = set() if gap is None else set(gap.inputs or set(robot.inputs) - cameras)
        self.gates = {
            name: InputGate(cfg, self.period_s, gap_s if name in watched else None)
            for name, cfg in robot.inputs.items()
        }
        self._stamped_input = next((n for n, g in self.gates.items() if g.stamped), None)
        self.sim_input_wait: PeriodInputWait | None = (
            PeriodInputWait(self.gates[self._stamped_input], self.period_s, self._accepted)
            if sim_clock is not None and self._stamped_input is not None
            else None
        )
        """Simulation time: ticks wait for a state the clock overtook on the wire (see its module)."""
        self._answered_arrival: float | None = None
        self.received: dict[str, int] = dict.fromkeys(robot.inputs, 0)
        """Messages received per input (accepted or not)."""
        self.rejections: Counter[str] = Counter()
        """Rejected messages and unsafe periods, by reason (published on /diagnostics)."""
        self.transitions: Counter[str] = Counter()
        """``"<from>-><to>"`` state changes."""
        self.error_count = 0
        self.last_error = ""
        self.reason = "starting"
        self.active = active
        self._shut_down = False
        self._publish_lock = threading.RLock()
        for cfg in robot.inputs.values():
            transport.subscribe(cfg.topic, cfg.type, cfg.qos, self._admit(cfg.name), self._lost(cfg.name))
        if robot.safety.estop_topic:
            # Latched, so a node started after the stop still sees it; volatile too, because a
            # transient-local reader does not match a volatile writer (e.g. a plain `ros2 topic pub`).
            for qos in ("latched", "reliable"):
                transport.subscribe(robot.safety.estop_topic, "std_msgs/msg/Bool", qos, self._on_estop)
        cmd = robot.command
        if cmd.joints and len(cmd.joints) != self.io_spec.action_dim:
            raise ConfigError(
                f"{robot.path}: command.joints names {len(cmd.joints)} joints but the policy has "
                f"{self.io_spec.action_dim} actions"
            )
        # Offered DEADLINE: a driver requesting this deadline (or a longer one) is told by its
        # middleware when commands stop, whatever stopped them (real/ros2/README.md, "Command liveness").
        self._publish = transport.publisher(
            cmd.topic, cmd.type, cmd.qos, deadline_s=cmd.watchdog_periods * self.period_s
        )
        self._publish_stamped = (
            transport.publisher(cmd.stamped_topic, "sensor_msgs/msg/JointState", cmd.qos) if cmd.stamped_topic else None
        )
        self._command_names = [
            f"{f.name}_{i}" if f.size > 1 else f.name for f in self.io_spec.action_fields for i in range(f.size)
        ]
        self._publish_diagnostics = transport.publisher(
            DIAGNOSTICS_TOPIC, "diagnostic_msgs/msg/DiagnosticArray", "reliable"
        )
        self._publish_state = transport.publisher(STATE_TOPIC, "std_msgs/msg/String", "latched")
        self._transport = transport
        self._sim_clock = sim_clock
        self.loop = ControlLoop(
            self.period_s,
            self.step,
            clock,
            self._sleep_on_sim_clock if sim_clock else None,
            event_step=lambda now_s: self.step(now_s, sampled=False),
            rt_priority=rt_priority,
            watchdog=self._gap_deadline if gap is not None else None,
        )
        self.commands_sent = 0
        self._camera_frame: tuple[Any, np.ndarray] | None = None
        """The newest camera message the policy was fed and its decoded picture."""
        self._last_hold: np.ndarray | None = None
        self._last_diagnostics = -1e9

    # -- middleware callbacks (any thread) ------------------------------------------------------

    def _admit(self, name: str) -> Callable[[Any], None]:
        gate_name = name

        def on_message(message: Any) -> None:
            now = self._clock()
            with self._lock:
                self.received[gate_name] += 1
                rejected = self.gates[gate_name].offer(message, now, self.stamp_clock)
                if rejected is not None:
                    self._count_rejection(*rejected)
                    return
                self._accepted.notify_all()
                if gate_name == self._stamped_input or self._stamped_input is None:
                    self._answered_arrival = now

        return on_message

    def _count_rejection(self, reason: str, detail: str, log_first: bool = True) -> None:
        """Count one rejected message or unusable period under ``reason``; the first of each kind
        is logged with its detail (later ones only counted: a flood must not flood the log).
        ``log_first=False``: the caller logs it (a state transition names the same reason)."""
        self.rejections[reason] += 1
        self.last_error = detail
        if log_first and self.rejections[reason] == 1:
            log.warning(
                "rejected (%s): %s; further ones are counted on /diagnostics as rejected.%s", reason, detail, reason
            )

    def _lost(self, name: str) -> Callable[[], None]:
        def on_lost() -> None:
            with self._lock:
                self.gates[name].publishers_lost = True
            self.wake()

        return on_lost

    def _on_estop(self, message: Any) -> None:
        engaged = bool(getattr(message, "data", True))
        with self._lock:
            was = self.safety.estop_latched
            self.safety.set_estop(engaged)
        if engaged != was:
            log.warning("e-stop %s", "ENGAGED" if engaged else "released (re-arming)")
        if engaged:
            self.wake()

    def _sleep_on_sim_clock(self, deadline_s: float, stop: threading.Event) -> bool:
        """The loop's sleep on simulation time: until ``/clock`` reaches the deadline, then (for a
        period tick) until the state published with that clock has arrived."""
        assert self._sim_clock is not None
        alarm = self.loop.alarm
        if self._sim_clock.sleep_until(deadline_s, stop, alarm):
            return True
        if self.sim_input_wait is not None and deadline_s != -math.inf and not alarm.is_set():
            self.sim_input_wait.before_tick(self._sim_clock, lambda: stop.is_set() or alarm.is_set())
        return stop.is_set()

    def wake(self) -> None:
        """Have the loop thread run a (safety-only) step now."""
        self.loop.wake()
        if self._sim_clock is not None:
            self._sim_clock.poke()

    # -- parameters and lifecycle ---------------------------------------------------------------

    def set_params(self, params: Mapping[str, Any]) -> None:
        """Change robot params (e.g. the setpoint) live: safe command first, then re-arm."""
        merged = {**{k: list(v) for k, v in self.robot.params.items()}, **dict(params)}
        bad = [k for k in params if k not in self.robot.params]
        if bad:
            raise ConfigError(f"unknown robot param(s) {', '.join(bad)}; known: {', '.join(self.robot.params)}")
        values = {k: tuple(float(x) for x in np.atleast_1d(np.asarray(v, dtype=np.float64))) for k, v in merged.items()}
        robot = replace(self.robot, params=values)
        builder = ObservationBuilder(robot, self.io_spec)  # raises before anything changes
        with self._lock:
            self.robot, self.builder = robot, builder
            self.safety.state = (
                SafetyState.WAITING if self.safety.state is SafetyState.WAITING else SafetyState.REARMING
            )
            self.safety.good_periods = 0
        self._send_safe("parameters changed")

    def activate(self) -> None:
        """Lifecycle ``activate``: the policy may drive after the re-arm rule."""
        with self._lock:
            self.active = True
        log.info("activated")

    def deactivate(self, reason: str = "deactivated") -> None:
        """Lifecycle ``deactivate``: safe command now, and on every period until activated."""
        with self._lock:
            self.active = False
        self._send_safe(reason)

    # -- the control step -----------------------------------------------------------------------

    def _check_inputs(self, now_s: float) -> tuple[SafetyState, str, str] | None:
        for gate in self.gates.values():
            problem = gate.judge(now_s, self.stamp_clock)
            if problem is not None:
                return SafetyState.STALE, problem[0], problem[1]
        if self.safety.state not in (SafetyState.ARMED, SafetyState.HOLD):
            return None  # a gap matters only while the policy drives; it must not hide other reasons
        for gate in self.gates.values():
            problem = gate.gap(now_s)
            if problem is not None:
                return SafetyState.HOLD, problem[0], problem[1]
        return None

    def _gap_deadline(self) -> float:
        """The loop's watchdog: when the first watched input becomes a gap while the policy drives
        (``inf`` otherwise: in every other state the hold or safe command goes out each period)."""
        if self.safety.state is not SafetyState.ARMED:
            return math.inf
        return min(gate.gap_deadline() for gate in self.gates.values())

    def step(self, now_s: float, sampled: bool = True) -> np.ndarray | None:
        """One control period; returns the published command (physical units) or None.

        ``sampled=False`` (an event step between periods): act only when something is wrong,
        so the policy and its action history still advance exactly once per trained period.
        """
        with self._lock:
            latest = {name: g.latest.message for name, g in self.gates.items() if g.latest is not None}
            problem = None if self.active else (SafetyState.INACTIVE, "inactive", "node not activated")
            problem = problem or self._check_inputs(now_s)
            if problem is None and not sampled:
                return None
            answered = self._answered_arrival
            self._answered_arrival = None
            stamped = self.gates[self._stamped_input].latest if self._stamped_input is not None else None
            answered_stamp = stamped.stamp_ns if stamped is not None else None
        action: np.ndarray | None = None
        if problem is None:
            problem, action = self._policy(latest)
        if problem is not None and problem[1] not in ("no_data", "inactive"):
            with self._lock:
                self._count_rejection(problem[1], problem[2], log_first=False)
        self._update_hold(latest)
        with self._lock:
            before = self.safety.state
            command, armed = self.safety.step(None if problem is None else problem[0], action, self._last_hold)
            after = self.safety.state
        self.reason = "" if problem is None else problem[2]
        if armed and self.safety.sent_action is not None:
            self.builder.history.push(self.safety.sent_action)
        elif after is SafetyState.HOLD:
            # Still armed: the hold is the action of this period (event steps between periods
            # leave the history alone, so it advances once per trained period).
            if sampled and self.safety.sent_action is not None:
                self.builder.history.push(self.safety.sent_action)
        else:
            # The policy always restarts from an empty history, as at the start of an episode,
            # and a chunked policy from a fresh plan.
            self.builder.history.reset()
            self.runner.reset()
        if after is not before:
            self._transition(before, after, self.reason or "inputs valid")
        elif problem is not None and self.rejections[problem[1]] == 1:  # a new kind, no transition to name it
            log.warning("%s (%s): %s", after.value, problem[1], problem[2])
        if command is not None and self._send(command, answered_stamp):
            if answered is not None:
                self.loop.stats.latency_s.append(self._clock() - answered)
        else:
            command = None
        if now_s - self._last_diagnostics >= DIAGNOSTICS_PERIOD_S:
            self.publish_diagnostics()
        return command

    def _policy(self, latest: Mapping[str, Any]) -> tuple[tuple[SafetyState, str, str] | None, np.ndarray | None]:
        try:
            obs = self.builder.build(latest)
        except ObservationError as err:
            # Finite but absurd (beyond float32): the envelope names what is wrong, if it can.
            violation = self.envelope.violation(self.builder.fields) if self.builder.complete else None
            if violation is not None:
                return (SafetyState.ENVELOPE, f"envelope_{violation[0]}", violation[1]), None
            return (SafetyState.FAULT, err.reason, str(err)), None
        except Exception as err:  # a conversion bug must not take the robot down with it
            return (SafetyState.FAULT, "invalid_observation", f"unexpected {type(err).__name__}: {err}"), None
        violation = self.envelope.violation(self.builder.fields)
        if violation is not None:
            return (SafetyState.ENVELOPE, f"envelope_{violation[0]}", violation[1]), None
        image = None
        if self.runner.image_shape is not None and self.robot.camera is not None:
            camera = self.robot.camera
            message = latest[camera.input]
            # A camera slower than the loop leaves the same picture for several periods: decode
            # (and scale) each one once.
            if self._camera_frame is None or self._camera_frame[0] is not message:
                try:
                    decoded = decode_image(message, self.runner.image_shape, camera.resize, camera.input)
                except ObservationError as err:
                    return (SafetyState.FAULT, "invalid_image", str(err)), None
                self._camera_frame = (message, decoded)
            image = self._camera_frame[1]
        try:
            action = self.runner(obs, image)
        except Exception as err:
            return (SafetyState.FAULT, "policy_error", f"policy failed: {type(err).__name__}: {err}"), None
        if not np.all(np.isfinite(action)):
            return (SafetyState.FAULT, "non_finite_action", f"policy produced {action.tolist()}"), None
        return None, action

    def _update_hold(self, latest: Mapping[str, Any]) -> None:
        if self._hold is None:
            return
        try:
            value = self._hold.read(latest, np.zeros(0))
            # Only a complete, finite reading replaces the held command; otherwise the last
            # valid one stays (a NaN must never reach the robot as a "safe" command).
            if value.shape == (self.io_spec.action_dim,) and np.isfinite(value).all():
                self._last_hold = value
        except (ObservationError, ValueError, TypeError, AttributeError):
            pass

    def _send(self, command: np.ndarray, answered_stamp_ns: int | None = None, final: bool = False) -> bool:
        """Publish ``command``; after :meth:`shutdown` only its own final safe command goes out."""
        with self._publish_lock:
            if self._shut_down and not final:
                return False
            if final:
                self._shut_down = True
            return self._send_locked(command, answered_stamp_ns)

    def _send_locked(self, command: np.ndarray, answered_stamp_ns: int | None) -> bool:
        cmd = self.robot.command
        try:
            self._publish(command_message(cmd.type, cmd.path, command, cmd.layout_label))
            if self._publish_stamped is not None:
                stamp = _stamp_ns(answered_stamp_ns) if answered_stamp_ns is not None else _stamp(self.stamp_clock())
                self._publish_stamped(
                    messages.make(
                        "sensor_msgs/msg/JointState",
                        {"header": {"stamp": stamp}, "name": self._command_names, "position": command},
                    )
                )
        except Exception as err:
            self.error_count += 1
            self.last_error = f"cannot publish on {cmd.topic}: {err}"
            log.error("%s", self.last_error)
            return False
        self.commands_sent += 1
        return True

    def _send_safe(self, reason: str, final: bool = False) -> bool:
        """Publish the safe command now (if one is known); log it. ``final``: nothing after it."""
        safe = self.safety.safe_command(self._last_hold)
        if safe is None:
            if final:
                with self._publish_lock:
                    self._shut_down = True
            log.warning("%s: no safe command known yet (no hold reading), nothing sent", reason)
            return False
        sent = self._send(safe, final=final)
        if sent:
            log.warning("%s: safe command %s sent", reason, np.round(safe, 6).tolist())
        return sent

    def _transition(self, before: SafetyState, after: SafetyState, reason: str) -> None:
        self.transitions[f"{before.value}->{after.value}"] += 1
        level = logging.INFO if after in (SafetyState.ARMED, SafetyState.REARMING) else logging.WARNING
        log.log(level, "%s -> %s: %s", before.value, after.value, reason)
        try:
            self._publish_state(messages.make("std_msgs/msg/String", {"data": f"{after.value}: {reason}"}))
        except Exception as err:
            log.error("cannot publish the state: %s", err)
        self.publish_diagnostics()

    def publish_diagnostics(self) -> None:
        """One ``diagnostic_msgs/DiagnosticArray`` with the state, reason and every counter."""
        self._last_diagnostics = self._clock()
        s = self.status()
        values = {
            "state": s["state"],
            "reason": self.reason,
            "rate_hz": f"{s['rate_hz']:.2f}",
            **{f"jitter_ms_{k}": f"{v:.3f}" for k, v in self.loop.stats.jitter_summary_ms().items()},
            "overruns": str(s["overruns"]),
            "missed_deadlines": str(self.loop.stats.missed_deadlines),
            "event_steps": str(self.loop.stats.event_steps),
            "scheduling": self.loop.stats.scheduling,
            "commands": str(self.commands_sent),
            "received": str(s["received"]),
            "decode_errors": str(s["decode_errors"]),
            **{f"rejected.{k}": str(v) for k, v in sorted(self.rejections.items())},
            **{f"transitions.{k}": str(v) for k, v in sorted(self.transitions.items())},
        }
        state = self.safety.state
        message = messages.make(
            "diagnostic_msgs/msg/DiagnosticArray",
            {
                "header": {"stamp": _stamp(self.stamp_clock())},
                "status": [
                    {
                        "level": _LEVELS.get(state, ERROR),
                        "name": f"{NODE_NAME}: {self.robot.name}",
                        "message": f"{state.value}: {self.reason}" if self.reason else state.value,
                        "hardware_id": self.robot.name,
                        "values": [{"key": k, "value": v} for k, v in values.items()],
                    }
                ],
            },
        )
        try:
            self._publish_diagnostics(message)
        except Exception as err:
            log.error("cannot publish /diagnostics: %s", err)

    @property
    def state(self) -> SafetyState:
        return self.safety.state

    def status(self) -> dict[str, Any]:
        """Numbers for a live status line."""
        stats: LoopStats = self.loop.stats
        return {
            "state": self.safety.state.value,
            "rate_hz": stats.rate_hz(),
            "latency_ms": stats.percentiles_ms(),
            "jitter_ms": stats.jitter_ms(),
            "steps": stats.steps,
            "overruns": stats.overruns,
            "commands": self.commands_sent,
            "received": sum(self.received.values()),
            "errors": self.error_count + sum(self.rejections.values()),
            "rejections": dict(self.rejections),
            "last_error": self.last_error,
            "decode_errors": int(getattr(self._transport, "decode_errors", 0)),
        }

    def shutdown(self, reason: str) -> None:
        """Send the safe command as the last command and publish the final state (idempotent;
        safe to call from a signal handler while the loop runs: no command follows it)."""
        with self._publish_lock:
            if self._shut_down:
                return
        self.active = False
        self._send_safe(f"shutting down ({reason})", final=True)
        self.wake()  # a loop asleep until its next deadline ends now
        try:
            self._publish_state(messages.make("std_msgs/msg/String", {"data": f"shutdown: {reason}"}))
        except Exception as err:
            log.error("cannot publish the state: %s", err)
        self.publish_diagnostics()

    def run(self, stop: threading.Event, duration_s: float | None = None, max_steps: int | None = None) -> LoopStats:
        """Run the control loop in this thread until ``stop`` is set (or the limits are hit).

        Whatever ends the loop (stop, limit, exception), the safe command goes out last.
        """
        reason = "stopped"
        try:
            return self.loop.run(stop, max_steps=max_steps, duration_s=duration_s)
        except BaseException as err:
            reason = f"{type(err).__name__}: {err}"
            raise
        finally:
            self.shutdown(reason)
