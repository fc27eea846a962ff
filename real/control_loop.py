"""Fixed-rate control loop on its own clock, with jitter, overrun and latency statistics.

The loop steps every ``period_s`` on absolute deadlines (no drift), the policy's trained rate:
sensor messages are sampled by the step, never a trigger, so the action history and any
integrator advance exactly once per trained period whatever the sensor rate. A step that ends
after the next deadline is an overrun; missed deadlines are skipped, not bunched up.
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


def _percentiles_ms(samples: deque[float]) -> tuple[float, float, float]:
    if not samples:
        return (float("nan"),) * 3
    p50, p90, p99 = np.percentile(np.asarray(samples), [50, 90, 99]) * 1e3
    return float(p50), float(p90), float(p99)


@dataclass
class LoopStats:
    """Counters and recent timing samples (seconds) of a running loop."""

    steps: int = 0
    overruns: int = 0
    missed_deadlines: int = 0

    def __post_init__(self) -> None:
        self.latency_s: deque[float] = deque(maxlen=_WINDOW)
        """Input arrival -> command publish, one sample per step that used a new input."""
        self.step_times: deque[float] = deque(maxlen=256)
        """Monotonic start time of recent steps (for the measured rate)."""
        self.period_error_s: deque[float] = deque(maxlen=_WINDOW)
        """``|start_k - start_(k-1) - period|`` of consecutive steps: the period jitter."""
        self.lateness_s: deque[float] = deque(maxlen=_WINDOW)
        """Step start minus its deadline (wake-up latency of the loop thread)."""

    def percentiles_ms(self) -> tuple[float, float, float]:
        """``(p50, p90, p99)`` of the recent latencies in milliseconds (NaN when none yet)."""
        return _percentiles_ms(self.latency_s)

    def jitter_ms(self) -> tuple[float, float, float]:
        """``(p50, p90, p99)`` of the recent period jitter in milliseconds."""
        return _percentiles_ms(self.period_error_s)

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
    ) -> None:
        """``sleep_until(deadline, stop) -> stopped`` waits on ``clock``'s time base; the default
        sleeps ``deadline - clock()`` wall seconds (right for a monotonic clock)."""
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._step = step
        self._clock = clock
        self._sleep_until = sleep_until or self._sleep_wall
        self.stats = LoopStats()

    def _sleep_wall(self, deadline: float, stop: threading.Event) -> bool:
        delay = deadline - self._clock()
        return stop.wait(timeout=delay) if delay > 0 else stop.is_set()

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
        if self._sleep_until(-math.inf, stop):  # a simulation clock may not have started yet
            return self.stats
        t0 = self._clock()
        next_deadline = t0
        while not stop.is_set():
            if max_steps is not None and self.stats.steps >= max_steps:
                break
            if duration_s is not None and self._clock() - t0 >= duration_s:
                break
            if self._sleep_until(next_deadline, stop):
                break
            self._run_step(next_deadline)
            next_deadline += self.period_s
            now = self._clock()
            if now > next_deadline:
                # Skip whole periods we cannot catch up on instead of firing them back to back.
                missed = int((now - next_deadline) / self.period_s) + 1
                self.stats.missed_deadlines += missed
                next_deadline += missed * self.period_s
        return self.stats
