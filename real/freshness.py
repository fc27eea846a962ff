"""Per-input admission and freshness: header stamps and arrival time, limits from the policy rate.

Each input message is *offered* when it arrives: it is rejected (and counted by reason) when its
frame is not the configured one, its header stamp is zero, or the stamp goes backwards (an
out-of-order or replayed message must not replace newer data). Every control period the newest
accepted message is *judged*: stale when it arrived too long ago (``stale_timeout_s``) or its
header stamp is too old or in the future against the node's clock (``max_stamp_age_s``).

Default limits follow from the control period: a sensor that misses
:data:`STALE_ARRIVAL_PERIODS` periods in a row is gone; a stamp may lag the node's clock by
transport delay, scheduling and clock offset up to :data:`STALE_STAMP_PERIODS` periods. Both
tolerate the scheduler stalls of a heavily loaded 2-core machine (gaps of 100-150 ms were seen
between consecutive sensor messages at load ~14) without cutting a vehicle's motors in flight,
and still stop a policy acting on data that is a fraction of a second old.

Before that limit, a *gap* (no new message for ``safety.gap_hold.after_periods`` periods, 1.5 by
default) is the first stage: the node sends the robot's hold command without disarming (see
:mod:`embodied.real.safety`), and :meth:`InputGate.gap_deadline` tells the control loop when to
check, between periods too.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from embodied.real.robot_config import InputCfg

STALE_ARRIVAL_PERIODS = 20
"""Default ``stale_timeout_s`` in control periods (0.2 s at 100 Hz)."""
STALE_STAMP_PERIODS = 30
"""Default ``max_stamp_age_s`` in control periods (0.3 s at 100 Hz)."""

# Rejection reasons (counted on /diagnostics under these names).
FRAME = "wrong_frame"
ZERO_STAMP = "zero_stamp"
OUT_OF_ORDER = "stamp_out_of_order"
NO_DATA = "no_data"
STALE_ARRIVAL = "stale_arrival"
STALE_STAMP = "stale_stamp"
FUTURE_STAMP = "future_stamp"
PUBLISHER_LOST = "publisher_lost"
INPUT_GAP = "input_gap"


def stamp_ns(message: Any) -> int:
    """``header.stamp`` in integer nanoseconds (rosbags, Cyclone and rclpy messages alike); exact,
    unlike float seconds, so a stamp can be echoed and matched."""
    stamp = message.header.stamp
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


@dataclass
class _Latest:
    message: Any
    arrival_s: float
    stamp_ns: int | None

    @property
    def stamp_s(self) -> float | None:
        return None if self.stamp_ns is None else self.stamp_ns * 1e-9


class InputGate:
    """Admission and freshness of one input. Not thread-safe: the node holds its lock."""

    def __init__(self, cfg: InputCfg, period_s: float, gap_s: float | None = None) -> None:
        """``gap_s``: time since the newest arrival that counts as a gap (``None``: not watched)."""
        self.cfg = cfg
        self.gap_s = gap_s
        self.stamped = cfg.stamped
        self.stale_timeout_s = cfg.stale_timeout_s or STALE_ARRIVAL_PERIODS * period_s
        self.max_stamp_age_s = cfg.max_stamp_age_s or STALE_STAMP_PERIODS * period_s
        self.latest: _Latest | None = None
        self.previous_stamp_ns: int | None = None
        """Header stamp of the accepted message before :attr:`latest` (its spacing tells the input's rate)."""
        self.accepted = 0
        self.publishers_lost = False
        """Set by the transport when the last publisher left; cleared by the next message."""

    def offer(self, message: Any, arrival_s: float, clock_s: Callable[[], float]) -> tuple[str, str] | None:
        """Keep ``message`` as the newest, or return ``(reason, detail)`` why it was rejected.

        A stamp further in the future than ``max_stamp_age_s`` is rejected here, not only judged
        later: kept, it would make every correctly stamped message after it look out of order.
        """
        stamp: float | None = None
        ns: int | None = None
        if self.stamped:
            try:
                ns = stamp_ns(message)
                stamp = ns * 1e-9
                frame = str(message.header.frame_id)
            except (AttributeError, TypeError, ValueError) as err:
                return ZERO_STAMP, f"{self.cfg.name}: unreadable header ({err})"
            if self.cfg.frame_id and frame != self.cfg.frame_id:
                return FRAME, f"{self.cfg.name}: frame_id {frame!r}, expected {self.cfg.frame_id!r}"
            if stamp <= 0.0:
                return ZERO_STAMP, f"{self.cfg.name}: header stamp is zero (the publisher must stamp its data)"
            ahead = stamp - clock_s()
            if ahead > self.max_stamp_age_s:
                return FUTURE_STAMP, f"{self.cfg.name}: header stamp {ahead * 1e3:.0f} ms in the future (clock skew?)"
            latest = self.latest
            if latest is not None and latest.stamp_ns is not None and ns < latest.stamp_ns:
                return OUT_OF_ORDER, (
                    f"{self.cfg.name}: stamp {stamp:.6f} is older than the newest accepted {latest.stamp_ns * 1e-9:.6f}"
                )
        self.previous_stamp_ns = None if self.latest is None else self.latest.stamp_ns
        self.latest = _Latest(message, arrival_s, ns)
        self.publishers_lost = False
        self.accepted += 1
        return None

    def gap_deadline(self) -> float:
        """When the newest message becomes a gap on the node's clock (``inf``: not watched, or
        no message yet)."""
        latest = self.latest
        return math.inf if self.gap_s is None or latest is None else latest.arrival_s + self.gap_s

    def gap(self, now_s: float) -> tuple[str, str] | None:
        """``(INPUT_GAP, detail)`` when no message arrived for ``gap_s`` at ``now_s``, else ``None``."""
        since = now_s - (self.latest.arrival_s if self.latest is not None else math.inf)
        if self.gap_s is None or not since >= self.gap_s:
            return None
        return INPUT_GAP, (
            f"{self.cfg.name}: no message for {since * 1e3:.1f} ms (hold after {self.gap_s * 1e3:.1f} ms)"
        )

    def judge(self, now_s: float, clock_s: Callable[[], float]) -> tuple[str, str] | None:
        """``None`` when the newest message is fresh at monotonic ``now_s``; else ``(reason, detail)``.

        ``clock_s`` is the clock header stamps are compared with (system or simulation time).
        """
        latest = self.latest
        if latest is None:
            return NO_DATA, f"{self.cfg.name}: no message on {self.cfg.topic} yet"
        if self.publishers_lost:
            return PUBLISHER_LOST, f"{self.cfg.name}: every publisher of {self.cfg.topic} left"
        since = now_s - latest.arrival_s
        if since > self.stale_timeout_s:
            return STALE_ARRIVAL, (
                f"{self.cfg.name}: last message {since * 1e3:.0f} ms ago (limit {self.stale_timeout_s * 1e3:.0f} ms)"
            )
        if latest.stamp_s is not None:
            now_clock = clock_s()
            if now_clock != now_clock:  # NaN: simulation time not received yet
                return STALE_STAMP, f"{self.cfg.name}: no clock yet to judge stamps against (waiting for /clock)"
            age = now_clock - latest.stamp_s
            if age > self.max_stamp_age_s:
                return STALE_STAMP, (
                    f"{self.cfg.name}: header stamp {age * 1e3:.0f} ms old (limit {self.max_stamp_age_s * 1e3:.0f} ms)"
                )
            if age < -self.max_stamp_age_s:
                return FUTURE_STAMP, f"{self.cfg.name}: header stamp {-age * 1e3:.0f} ms in the future (clock skew?)"
        return None


class SimClock:
    """Simulation time from ``rosgraph_msgs/Clock`` (``use_sim_time``): seconds, NaN until the
    first ``/clock`` message (stamps are then never fresh).

    With it the node's control loop, arrival ages and stamp ages all run on simulation time, as
    ROS 2 timers do with ``use_sim_time``: a simulator that waits for the node (lockstep) can be
    starved of CPU for any wall time without the node seeing stale data.
    """

    TOPIC = "/clock"
    TYPE = "rosgraph_msgs/msg/Clock"
    TOLERANCE_S = 1e-6
    """A deadline counts as reached this close (the clock is integer ns, deadlines are sums of floats)."""

    def __init__(self) -> None:
        self.now_s = float("nan")
        self._cond = threading.Condition()

    def on_clock(self, message: Any) -> None:
        with self._cond:
            self.now_s = float(message.clock.sec) + 1e-9 * float(message.clock.nanosec)
            self._cond.notify_all()

    def __call__(self) -> float:
        return self.now_s

    def poke(self) -> None:
        """Wake :meth:`sleep_until` to re-check its ``stop`` and ``alarm`` events now."""
        with self._cond:
            self._cond.notify_all()

    def sleep_until(self, deadline_s: float, stop: threading.Event, alarm: threading.Event | None = None) -> bool:
        """Block until simulation time reaches ``deadline_s`` (any time, for ``-inf``), ``stop``
        or ``alarm`` is set (both are re-checked on :meth:`poke`); returns ``True`` when stopped.

        An alarm must not wait for ``/clock``: the simulator that publishes it may be the peer
        that just left."""

        def reached() -> bool:
            now = self.now_s
            if stop.is_set() or (alarm is not None and alarm.is_set()):
                return True
            return now == now and now >= deadline_s - self.TOLERANCE_S

        with self._cond:
            while not self._cond.wait_for(reached, timeout=0.05):
                pass
        return stop.is_set()
