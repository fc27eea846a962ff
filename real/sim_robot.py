"""A simulated robot behind ROS 2 topics: publishes its state, applies the commands it receives.

``embodied sim-robot quad-hover`` runs one env of the task as if it were the real vehicle: it
publishes ``nav_msgs/Odometry`` on every odometry input of the robot config (pose in the world,
twist in the body frame, as ROS defines it) and maps the command message back to the policy's
normalized action with ``policy_io``'s scale/offset. The deployment node runs in another
process, so the whole loop crosses the middleware twice per step.

Modes:

- lockstep (default): simulation time advances one control period per step and is published
  on ``/clock`` (odometry is stamped with it); after publishing a state, wait for the node's
  answer *to that state* (the robot config's ``command.stamped_topic``: a JointState echo of
  every command, stamped with the odometry stamp it answers), then step. Run the node with
  ``--use-sim-time``: its loop then ticks on ``/clock``, so the simulator can be starved of CPU
  for any wall time without the node seeing stale data, and every step applies the command
  computed from the state it followed.
- realtime: step every control period of wall-clock time and apply whichever command arrived
  last (zero-order hold), as a physical robot would.

Command liveness (both modes): once no new command has arrived for the robot config's
``command.watchdog_periods`` control periods (a node killed, hung or cut off), the robot applies
its safe command (``safety.safe_command``; a ``hold`` robot keeps its last position target) until
commands arrive again. Realtime measures the silence on its wall clock at every tick; lockstep
counts steps whose state got no answer within the command timeout. ``watchdog_trips`` and ``watchdog_periods`` in the
summary report each engagement and how many periods passed since the last command when it did.

After arming, every applied command equal to the robot's safe command is counted
(``safe_commands``: motors-off in flight for a quadrotor). SIGINT/SIGTERM (:meth:`SimRobot.halt`)
end the session at once: every wait is on an event the handler sets, no further physics step
runs, and the caller closes the transport first, so the node sees its input publisher leave (and
sends its safe command) within about one message delivery of the signal.

Until the node arms (its commands differ from the robot's safe command), the vehicle is held
at its initial state, like a drone waiting on the ground for its controller.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from embodied.env import ObsDict, PhysicalStateEnv
from embodied.errors import EmbodiedError
from embodied.real import messages
from embodied.real.freshness import SimClock
from embodied.real.robot_config import RobotConfig
from embodied.real.safety import ActionMap
from embodied.real.sim_state import state_publisher
from embodied.real.transports import Transport

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 2.0
"""Wall time the lockstep simulator waits for the answer to a published state before it stops
(the node's own wait for a state in flight, ``sim_input_wait.WAIT_S``, stays below it)."""

CLOCK_NUDGES = 4
"""Lockstep: extra periods of /clock granted to a node that ticked without the newest state
(its echo answered an older one) before that state counts as unanswered."""
MAX_MISSED_IN_ROW = 10
"""Lockstep: this many unanswered states in a row after the watchdog engaged mean the node is gone;
end the session (``node_lost``) instead of stalling."""


@dataclass(frozen=True)
class SimSummary:
    """Outcome of a sim-robot session."""

    episodes: int
    successes: int
    success_rate: float
    mean_episode_steps: float
    episode_steps: tuple[int, ...]
    """Length of each ended episode, in order (a short one points at the episode to replay)."""
    steps: int
    commands: int
    missed_commands: int
    """Steps where no command arrived in time (the previous command was held)."""
    safe_commands: int
    """Steps after arming that applied the robot's safe command (spurious motors-off)."""
    rtt_ms: tuple[float, float, float]
    """State publish -> command arrival, p50/p90/p99 (lockstep mode)."""
    wall_s: float
    watchdog_trips: int = 0
    """Times the command watchdog engaged (no new command for ``command.watchdog_periods``)."""
    watchdog_periods: tuple[float, ...] = ()
    """For each trip, control periods from the last command's arrival to the step that applied
    the safe command (realtime: on the wall clock; lockstep: unanswered steps)."""
    safe_at_end: bool = False
    """The last applied command was the robot's safe command."""
    node_lost: bool = False
    """Lockstep ended because states went unanswered long past the watchdog (the node is gone)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SimRobot:
    """One env of a task published over ``transport`` with the topics of ``robot``."""

    def __init__(self, env: Any, robot: RobotConfig, transport: Transport, task: str = "") -> None:
        """``task``: the env's task name (chooses what is published, :func:`state_publisher`)."""
        if env.num_envs != 1:
            raise EmbodiedError(f"sim-robot drives exactly one env, got num_envs={env.num_envs}")
        self.env = env
        if hasattr(env, "physical_actions"):  # commands arrive in M1..M4 labels (no task-side yaw flip)
            env.physical_actions = True
        self.robot = robot
        self._check_setpoint()
        self.actions = ActionMap.from_io_spec(env.io_spec())
        self._state = state_publisher(task, env, robot, transport)
        self._obs: ObsDict | None = None
        """The env's newest observation (what the state publisher publishes)."""
        self._cond = threading.Condition()
        self._command: np.ndarray | None = None
        self._command_count = 0
        self._bad_commands = 0
        self._answers: dict[int, np.ndarray] = {}
        """Stamp (ns) of the state answered -> command, from the stamped echo (lockstep)."""
        self._ticks_without_newest = 0
        """Echoes of a state older than the newest published one: ticks whose /clock overtook the state."""
        self._last_stamp_ns = 0
        cmd = robot.command
        transport.subscribe(cmd.topic, cmd.type, cmd.qos, self._on_command)
        if cmd.stamped_topic:
            transport.subscribe(cmd.stamped_topic, "sensor_msgs/msg/JointState", cmd.qos, self._on_answer)
        self.stop = threading.Event()
        """Set by :meth:`halt` to end :meth:`run` at once."""
        self._publish_clock = transport.publisher(SimClock.TOPIC, SimClock.TYPE, "reliable")
        self.sim_time_ns: int | None = None
        """Lockstep: simulation time (ns), advanced one control period per step; None in realtime."""
        self._period_ns = round(float(env.dt) * 1e9)
        self._safe = None if robot.safety.safe_command is None else np.asarray(robot.safety.safe_command)
        self._last_command_s = time.monotonic()
        """Monotonic arrival time of the newest command (the watchdog's reference)."""

    def _on_command(self, message: Any) -> None:
        values = messages.to_vector(messages.get_path(message, self.robot.command.path))
        if values.shape != (len(self.actions.scale),) or not np.isfinite(values).all():
            self._bad_commands += 1
            log.error(
                "ignoring command with %d values (want %d) or non-finite entries", values.size, len(self.actions.scale)
            )
            return
        with self._cond:
            self._command = values
            self._command_count += 1
            self._last_command_s = time.monotonic()
            self._cond.notify_all()

    def _on_answer(self, message: Any) -> None:
        values = messages.to_vector(message.position)
        if values.shape != (len(self.actions.scale),) or not np.isfinite(values).all():
            return
        stamp_ns = int(message.header.stamp.sec) * 1_000_000_000 + int(message.header.stamp.nanosec)
        with self._cond:
            if stamp_ns < self._last_stamp_ns:
                self._ticks_without_newest += 1
            self._answers[stamp_ns] = values
            if len(self._answers) > 64:  # answers to states long gone
                for old in sorted(self._answers)[:-16]:
                    del self._answers[old]
            self._cond.notify_all()

    def halt(self) -> None:
        """End :meth:`run` now (safe in a signal handler: waits are woken, nothing blocks)."""
        self.stop.set()
        with self._cond:  # reentrant, and released by a waiting main thread
            self._cond.notify_all()

    def _wait_answer(self, stamp_ns: int, timeout_s: float, ticks_seen: int) -> tuple[np.ndarray | None, int]:
        """``(command, ticks)``: the node's command computed from the state stamped ``stamp_ns``
        (None on timeout or halt), returned early when the count of echoes answering an older
        state (ticks on a /clock that overtook this state on the wire) passes ``ticks_seen``."""
        with self._cond:
            self._cond.wait_for(
                lambda: stamp_ns in self._answers or self.stop.is_set() or self._ticks_without_newest > ticks_seen,
                timeout=timeout_s,
            )
            return self._answers.pop(stamp_ns, None), self._ticks_without_newest

    def _check_setpoint(self) -> None:
        # Odometry carries true world positions and attitudes; the node subtracts its own setpoint
        # parameters (position, heading yaw), which must therefore be the task's for the comparison
        # with simulation to hold. Checked again at every episode start (a task may draw them).
        if not isinstance(self.env, PhysicalStateEnv):
            return  # other tasks publish their goal as an input
        state = self.env.physical_state()
        # Robot parameter -> the task's physical_state key of the same quantity.
        for key, state_key, size in (("setpoint_w", "setpoint_w", 3), ("setpoint_yaw_rad", "yaw_sp_rad", 1)):
            value, wanted = state.get(state_key), self.robot.params.get(key)
            if value is None or wanted is None:
                continue
            task_value = torch.as_tensor(value).reshape(-1, size)[0].double().cpu().numpy()
            if not np.allclose(task_value, wanted, atol=1e-6):
                raise EmbodiedError(
                    f"the task's {key} is {task_value.tolist()} but {self.robot.path} has {key} "
                    f"{list(wanted)}: pass --param {key}={task_value.tolist()} to both sim-robot and deploy "
                    "(a task that draws a new setpoint per episode cannot be served this way)"
                )

    def publish_state(self) -> int:
        """Publish the current state; returns its stamp in nanoseconds (unique per state)."""
        if self._obs is None:
            raise EmbodiedError("sim-robot: publish_state() before the env was reset")
        # Strictly increasing stamps: the node rejects a stamp older than the newest it has seen.
        stamp_ns = self.sim_time_ns if self.sim_time_ns is not None else max(time.time_ns(), self._last_stamp_ns + 1)
        self._last_stamp_ns = stamp_ns
        self._state.publish(self._obs, stamp_ns)
        return stamp_ns

    def advance_clock(self) -> None:
        """Lockstep: one control period of simulation time passes; publish it on ``/clock``."""
        if self.sim_time_ns is None:
            return
        self.sim_time_ns += self._period_ns
        ns = self.sim_time_ns
        self._publish_clock(messages.make(SimClock.TYPE, {"clock": {"sec": ns // 10**9, "nanosec": ns % 10**9}}))

    def _wait_command(self, after: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._command_count > after or self.stop.is_set(), timeout=timeout_s)

    def _armed_command(self) -> bool:
        with self._cond:
            cmd = self._command
        return cmd is not None and (self._safe is None or not np.allclose(cmd, self._safe))

    def wait_until_armed(self, timeout_s: float) -> None:
        """Republish the (frozen) initial state until the node sends a non-safe command."""
        deadline = time.monotonic() + timeout_s
        period = self.env.dt
        while time.monotonic() < deadline and not self.stop.is_set():
            with self._cond:
                count = self._command_count
            # The state first, then the time it belongs to: a node on /clock wakes with it in hand.
            self.publish_state()
            self.advance_clock()
            self._wait_command(count, period)
            if self._armed_command():
                return
            self.stop.wait(max(0.0, period - 0.001))
        if self.stop.is_set():
            return
        raise EmbodiedError(
            f"no armed command on {self.robot.command.topic} within {timeout_s:.0f} s: is `embodied deploy` "
            "running with the same robot config, transport and domain?"
        )

    def run(
        self,
        episodes: int | None = None,
        seconds: float | None = None,
        seed: int = 0,
        realtime: bool = False,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        arm_timeout_s: float = 30.0,
        on_step: Callable[[ObsDict, np.ndarray], None] | None = None,
    ) -> SimSummary:
        """Fly until ``episodes`` episodes ended or ``seconds`` of wall time passed.

        ``on_step(obs, action)``: called before every physics step with the observation whose
        state was published and the normalized action ``[A]`` about to be applied (for checks)."""
        if episodes is None and seconds is None:
            raise EmbodiedError("give a stop condition: --episodes N and/or --seconds S")
        lockstep = not realtime
        if lockstep and not self.robot.command.stamped_topic:
            raise EmbodiedError(
                f"{self.robot.path}: lockstep needs command.stamped_topic (the node's stamped echo of each "
                "command) to match answers to states; set it or use --realtime"
            )
        env = self.env
        self._obs = env.reset(seed=seed)
        # Simulation time starts at the wall time (stamps look plausible to any tool) and then
        # moves only with the simulation.
        self.sim_time_ns = None if realtime else time.time_ns()
        t_arm = time.monotonic()
        self.wait_until_armed(arm_timeout_s)
        log.info("node armed after %.2f s; flying", time.monotonic() - t_arm)
        t0 = time.monotonic()
        done_episodes = successes = steps = missed = missed_in_row = safe_count = 0
        lengths: list[int] = []
        rtts: list[float] = []
        ep_len = 0
        period = float(env.dt)
        next_tick = time.monotonic()
        command: np.ndarray | None = None
        applied: np.ndarray | None = None
        silent = 0.0
        """Control periods since the last new command (realtime: wall clock; lockstep: unanswered steps)."""
        watchdog_after = self.robot.command.watchdog_periods
        watchdog_engaged = node_lost = False
        trips: list[float] = []
        while (episodes is None or done_episodes < episodes) and (seconds is None or time.monotonic() - t0 < seconds):
            if self.stop.is_set():
                break
            with self._cond:
                count = self._command_count
                # before the state goes out: the node may answer an older one before we wait
                ticks_seen = self._ticks_without_newest
            sent = time.perf_counter()
            stamp_ns = self.publish_state()
            self.advance_clock()
            if realtime:
                next_tick += period
                if self.stop.wait(max(0.0, next_tick - time.monotonic())):
                    break
                with self._cond:
                    command = self._command
                    missed += int(self._command_count == count)
                    # On the wall clock, not in ticks: a loop catching up after a stall runs ticks
                    # back to back, and those are not periods without a command.
                    silent = (time.monotonic() - self._last_command_s) / period
            else:
                answer, nudges = None, 0
                give_up = time.monotonic() + command_timeout_s
                while not self.stop.is_set() and (remaining_s := give_up - time.monotonic()) > 0:
                    answer, ticks = self._wait_answer(stamp_ns, remaining_s, ticks_seen)
                    if answer is not None:
                        break
                    ticked_without, ticks_seen = ticks > ticks_seen, ticks
                    if ticked_without and nudges < CLOCK_NUDGES:
                        # /clock overtook the state on the wire, so the node's tick used the previous
                        # one: let another period pass (time only; the physics waits). Silence alone
                        # is no reason: a node starved of CPU would then see simulation time pass
                        # without a new state (an input gap that a real robot never had).
                        self.advance_clock()
                        nudges += 1
                if self.stop.is_set():
                    break
                if answer is not None:
                    rtts.append(time.perf_counter() - sent)
                    missed_in_row = 0
                    command = answer
                else:
                    missed += 1
                    missed_in_row += 1
                    if missed_in_row >= math.ceil(watchdog_after) + MAX_MISSED_IN_ROW:
                        log.error(
                            "%d states in a row got no answer on %s within %s s: the node stopped",
                            missed_in_row,
                            self.robot.command.stamped_topic,
                            command_timeout_s,
                        )
                        node_lost = True
                        break
                    with self._cond:
                        command = self._command if command is None else command
                silent = float(missed_in_row)
            assert command is not None  # set before wait_until_armed returned
            already_safe = self._safe is not None and bool(np.allclose(command, self._safe))
            if silent >= watchdog_after and not already_safe:
                if not watchdog_engaged:
                    watchdog_engaged = True
                    trips.append(silent)
                    log.warning(
                        "no new command for %.1f periods (watchdog %g): applying the safe command",
                        silent,
                        self.robot.command.watchdog_periods,
                    )
                if self._safe is not None:  # a hold robot keeps its last position target (a standstill)
                    command = self._safe
            elif silent < watchdog_after:
                watchdog_engaged = False
            applied = command
            if self._safe is not None and np.allclose(command, self._safe):
                safe_count += 1
            normalized = self.actions.to_normalized(command)
            if on_step is not None:
                assert self._obs is not None
                on_step(self._obs, normalized)
            action = torch.as_tensor(normalized, dtype=torch.float32, device=env.device)
            self._obs, _reward, terminated, truncated, info = env.step(action.reshape(1, -1))
            steps += 1
            ep_len += 1
            if bool(terminated[0] | truncated[0]):
                self._check_setpoint()
                done_episodes += 1
                successes += int(bool(info["success"][0]))
                lengths.append(ep_len)
                ep_len = 0
        wall = time.monotonic() - t0
        p50, p90, p99 = (np.percentile(rtts, [50, 90, 99]) * 1e3).tolist() if rtts else [float("nan")] * 3
        return SimSummary(
            episodes=done_episodes,
            successes=successes,
            success_rate=successes / done_episodes if done_episodes else float("nan"),
            mean_episode_steps=float(np.mean(lengths)) if lengths else float("nan"),
            episode_steps=tuple(lengths),
            steps=steps,
            commands=self._command_count,
            missed_commands=missed,
            safe_commands=safe_count,
            rtt_ms=(p50, p90, p99),
            wall_s=wall,
            watchdog_trips=len(trips),
            watchdog_periods=tuple(trips),
            safe_at_end=applied is not None and self._safe is not None and bool(np.allclose(applied, self._safe)),
            node_lost=node_lost,
        )
