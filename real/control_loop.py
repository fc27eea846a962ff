"""Fixed-rate control loop on its own clock, with jitter, overrun and latency statistics.

The loop steps every ``period_s`` on absolute deadlines (no drift), the policy's trained rate:
sensor messages are sampled by the step, never a trigger, so the action history and any
integrator advance exactly once per trained period whatever the sensor rate. A step that ends
after the next deadline is an overrun; missed deadlines are skipped, not bunched up.

Waking on time under load: the thread sleeps on an event until :data:`SPIN_S` before the
deadline, then spins on the clock (the kernel's wake-up latency lands inside the spin instead of
after the deadline); the thread's timer slack, real-time priority and a garbage-collector freeze
after warm-up are set by :mod:`embodied.real.realtime`. :meth:`ControlLoop.wake` runs an extra
*event* step at once (a safety event such as every input publisher leaving must not wait for the
next period); event steps do not count in the period statistics. A ``watchdog`` callable names
the next moment such an event is due on the loop's own clock (an input gap), so the wall-clock
loop also wakes then, without another thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Clock = Callable[[], float]
"""Monotonic seconds."""

SleepUntil = Callable[[float, threading.Event], bool]
"""``(deadline on the loop's clock, stop) -> True when stopped``."""

_WINDOW = 4096
"""Recent samples kept for the percentiles."""
SPIN_S = 0.0008
"""The wall-clock loop sleeps until this long before a deadline, then spins to it."""
WARMUP_STEPS = 50
"""Steps after which the objects alive are frozen out of the garbage collector."""


def _percentiles_ms(samples: deque[float], q: tuple[float, ...] = (50, 90, 99)) -> tuple[float, ...]:
    if not samples:
        return (float("nan"),) * len(q)
    return tuple(float(v) for v in np.percentile(np.asarray(samples), q) * 1e3)


@dataclass
class LoopStats:
    """Counters and recent timing samples (seconds) of a running loop."""

    steps: int = 0
    overruns: int = 0
    missed_deadlines: int = 0
    event_steps: int = 0
    """Extra steps run at once by :meth:`ControlLoop.wake` (not in the timing samples)."""
    scheduling: str = "default"
    """How the loop thread is scheduled (see :func:`embodied.real.realtime.tune_loop_thread`)."""

    def __post_init__(self) -> None:
        self.latency_s: deque[float] = deque(maxlen=_WINDOW)
        """Input arrival -> command publish, one sample per step that used a new input."""
        self.step_times: deque[float] = deque(maxlen=256)
        """Monotonic start time of recent steps (for the measured rate)."""
        self.period_error_s: deque[float] = deque(maxlen=_WINDOW)
        """``|start_k - start_(k-1) - period|`` of consecutive steps: the period jitter."""
        self.lateness_s: deque[float] = deque(maxlen=_WINDOW)
        """Step start minus its deadline (wake-up latency of the loop thread)."""

    def percentiles_ms(self) -> tuple[float, ...]:
        """``(p50, p90, p99)`` of the recent latencies in milliseconds (NaN when none yet)."""
        return _percentiles_ms(self.latency_s)

    def jitter_ms(self) -> tuple[float, ...]:
        """``(p50, p90, p99)`` of the recent period jitter in milliseconds."""
        return _percentiles_ms(self.period_error_s)

    def jitter_summary_ms(self) -> dict[str, float]:
        """Period jitter ``p50``/``p99``/``max`` and wake-up lateness ``late_p99`` in milliseconds."""
        p50, p99, worst = _percentiles_ms(self.period_error_s, (50, 99, 100))
        return {"p50": p50, "p99": p99, "max": worst, "late_p99": _percentiles_ms(self.lateness_s, (99,))[0]}

    def rate_hz(self) -> float:
        """Steps per second over the recent window."""
        if len(self.step_times) < 2:
            return 0.0
        span = self.step_times[-1] - self.step_times[0]
        return (len(self.step_times) - 1) / span if span > 0 else 0.0


class ControlLoop:
    """Calls ``step(now_s)`` every ``period_s`` of ``clock`` until stopped."""

    def __init__(
        self,
        period_s: float,
        step: Callable[[float], object],
        clock: Clock = time.monotonic,
        sleep_until: SleepUntil | None = None,
        event_step: Callable[[float], object] | None = None,
        rt_priority: int = 0,
        spin_s: float = SPIN_S,
        watchdog: Callable[[], float] | None = None,
    ) -> None:
        """``sleep_until(deadline, stop) -> stopped`` waits on ``clock``'s time base (it should
        return early when :attr:`alarm` is set); the default sleeps and spins on the wall clock
        (right for a monotonic clock). ``event_step(now)`` is what :meth:`wake` runs (default
        ``step``). ``rt_priority``: ``SCHED_FIFO`` priority of the loop thread, 0 for none.
        ``watchdog() -> time`` (wall-clock loop only): when an event step is due between periods
        (``inf``: none); asked again after every wake-up, so it may move while the loop sleeps."""
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._step = step
        self._event_step = event_step or step
        self._clock = clock
        self._wall = sleep_until is None
        self._sleep_until = sleep_until or self._sleep_wall
        self.rt_priority = rt_priority
        self.spin_s = spin_s
        self._watchdog = watchdog
        self.alarm = threading.Event()
        """Set by :meth:`wake`: the sleeping loop runs an event step now."""
        self.stats = LoopStats()

    def wake(self) -> None:
        """Run an event step as soon as possible (from any thread; the loop thread runs it)."""
        self.alarm.set()

    def _sleep_wall(self, deadline: float, stop: threading.Event) -> bool:
        clock, alarm = self._clock, self.alarm
        while True:
            if stop.is_set():
                return True
            if alarm.is_set():
                return False
            now = clock()
            remaining = deadline - now
            if remaining <= 0:
                return False
            due = self._watchdog() if self._watchdog is not None else math.inf
            if due <= now:
                alarm.set()  # the caller runs an event step
                return False
            if remaining > self.spin_s:
                alarm.wait(min(remaining - self.spin_s, due - now))
            else:
                while clock() < deadline and not alarm.is_set():
                    pass  # spin: the kernel's wake-up latency was spent in the sleep before
                return stop.is_set()

    def _run_step(self, deadline: float) -> None:
        start = self._clock()
        stats = self.stats
        if stats.step_times:
            stats.period_error_s.append(abs(start - stats.step_times[-1] - self.period_s))
        stats.step_times.append(start)
        stats.lateness_s.append(max(0.0, start - deadline))
        self._step(start)
        stats.steps += 1
        if self._clock() > deadline + self.period_s:
            stats.overruns += 1

    def run(self, stop: threading.Event, max_steps: int | None = None, duration_s: float | None = None) -> LoopStats:
        """Loop until ``stop`` is set, ``max_steps`` steps ran, or ``duration_s`` elapsed."""
        if self._wall:
            from embodied.real.realtime import tune_loop_thread

            self.stats.scheduling = tune_loop_thread(self.rt_priority)
        while True:
            if self._sleep_until(-math.inf, stop):  # a simulation clock may not have started yet
                return self.stats
            t0 = self._clock()
            if t0 == t0:  # not NaN: time has started (an alarm before that has nothing to act on)
                break
            self.alarm.clear()
        next_deadline = t0
        while not stop.is_set():
            if max_steps is not None and self.stats.steps >= max_steps:
                break
            if duration_s is not None and self._clock() - t0 >= duration_s:
                break
            if self._sleep_until(next_deadline, stop):
                break
            if self.alarm.is_set():
                self.alarm.clear()
                self.stats.event_steps += 1
                self._event_step(self._clock())
                continue
            self._run_step(next_deadline)
            if self.stats.steps == WARMUP_STEPS and self._wall:
                from embodied.real.realtime import freeze_gc

                freeze_gc()
            next_deadline += self.period_s
            missed = self._missed_periods(self._clock() - next_deadline)
            if missed:
                # Skip whole periods we cannot catch up on instead of firing them back to back.
                self.stats.missed_deadlines += missed
                next_deadline += missed * self.period_s
        return self.stats

    def _missed_periods(self, late_s: float) -> int:
        """Deadlines to skip when the clock reads ``late_s`` past the next one.

        On the wall clock any lateness means that deadline has passed: skip it and every whole
        period after it. A simulation clock advances in whole periods, and a lockstep simulator
        publishes the next one as soon as it has the command, often before this bookkeeping runs:
        the clock then sits *on* the next deadline, which is due, not missed. The deadlines are
        float sums near the epoch (stamps of about 1.8e9 s) that drift from the integer-nanosecond
        clock by rounding, so lateness is rounded to whole periods there instead of compared to 0.
        """
        if self._wall:
            return int(late_s / self.period_s) + 1 if late_s > 0 else 0
        return max(0, math.floor(late_s / self.period_s + 0.5))
