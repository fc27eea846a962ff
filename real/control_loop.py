"""Fixed-rate control loop with overrun accounting and latency statistics.

Two trigger modes:

- ``timer``: a step every ``period_s`` on absolute deadlines (no drift). A step that ends
  after the next deadline is an overrun; missed deadlines are skipped, not bunched up.
- ``input``: a step as soon as the trigger input delivers a new message (lowest latency, the
  robot's sensor sets the rate), and at least one step per period while it is silent, so the
  watchdog still commands the safe command on time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Clock = Callable[[], float]
"""Monotonic seconds."""


@dataclass
class LoopStats:
    """Counters and recent latency samples (seconds) of a running loop."""

    steps: int = 0
    overruns: int = 0
    missed_deadlines: int = 0

    def __post_init__(self) -> None:
        self.latency_s: deque[float] = deque(maxlen=4096)
        """Input arrival -> command publish, one sample per step that answered a new input."""
        self.step_times: deque[float] = deque(maxlen=256)
        """Monotonic start time of recent steps (for the measured rate)."""

    def percentiles_ms(self) -> tuple[float, float, float]:
        """``(p50, p90, p99)`` of the recent latencies in milliseconds (NaN when none yet)."""
        if not self.latency_s:
            return (float("nan"),) * 3
        p50, p90, p99 = np.percentile(np.asarray(self.latency_s), [50, 90, 99]) * 1e3
        return float(p50), float(p90), float(p99)

    def rate_hz(self) -> float:
        """Steps per second over the recent window."""
        if len(self.step_times) < 2:
            return 0.0
        span = self.step_times[-1] - self.step_times[0]
        return (len(self.step_times) - 1) / span if span > 0 else 0.0


class ControlLoop:
    """Calls ``step(now_s)`` at ``period_s`` (timer) or on ``trigger`` events (input mode)."""

    def __init__(
        self,
        period_s: float,
        step: Callable[[float], object],
        trigger: threading.Event | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._step = step
        self._trigger = trigger
        self._clock = clock
        self.stats = LoopStats()

    def _run_step(self, deadline: float | None) -> None:
        start = self._clock()
        self.stats.step_times.append(start)
        self._step(start)
        self.stats.steps += 1
        end = self._clock()
        budget_end = (deadline if deadline is not None else start) + self.period_s
        if end > budget_end:
            self.stats.overruns += 1

    def run(self, stop: threading.Event, max_steps: int | None = None, duration_s: float | None = None) -> LoopStats:
        """Loop until ``stop`` is set, ``max_steps`` steps ran, or ``duration_s`` elapsed."""
        t0 = self._clock()
        next_deadline = t0
        while not stop.is_set():
            if max_steps is not None and self.stats.steps >= max_steps:
                break
            if duration_s is not None and self._clock() - t0 >= duration_s:
                break
            if self._trigger is not None:
                # Wake on a new input, or after one period of silence for the watchdog.
                self._trigger.wait(timeout=self.period_s)
                self._trigger.clear()
                self._run_step(None)
                continue
            delay = next_deadline - self._clock()
            if delay > 0:
                stop.wait(timeout=delay)
                if stop.is_set():
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
