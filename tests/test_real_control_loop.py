"""The fixed-rate control loop: absolute deadlines, overrun accounting, no catch-up bursts, and
the latency statistics behind the live status line."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from embodied.real.control_loop import ControlLoop, LoopStats

PERIOD = 0.005


def test_timer_loop_counts_overruns_and_skips_missed_deadlines() -> None:
    starts: list[float] = []

    def step(now: float) -> None:
        starts.append(now)
        if len(starts) in (5, 10):
            time.sleep(3.5 * PERIOD)  # two slow steps, each spilling over several deadlines

    loop = ControlLoop(PERIOD, step)
    stats = loop.run(threading.Event(), max_steps=20)
    assert stats.steps == 20
    assert stats.overruns >= 2
    assert stats.missed_deadlines >= 4  # 2 x (at least 2 whole periods lost)
    # Missed deadlines are skipped, not fired back to back: 20 steps took at least the 19 periods
    # plus the 2 x 3 whole periods the slow steps lost.
    assert starts[-1] - starts[0] >= (19 + 2 * 3) * PERIOD * 0.98


def test_loop_runs_at_its_own_rate_and_records_jitter() -> None:
    """The loop's rate is its period, whatever else happens; jitter samples the period error."""
    t = [0.0]
    starts: list[float] = []

    def step(now: float) -> None:
        starts.append(now)

    def clock() -> float:
        return t[0]

    def sleep_until(deadline: float, stop: threading.Event) -> bool:
        # Deterministic clock: each wait overshoots by 1 ms on every 4th period.
        if deadline > t[0]:
            t[0] = deadline + (0.001 if len(starts) % 4 == 3 else 0.0)
        return stop.is_set()

    loop = ControlLoop(0.01, step, clock=clock, sleep_until=sleep_until)
    stats = loop.run(threading.Event(), max_steps=41)
    assert stats.steps == 41
    # Absolute deadlines: a late start shortens the next period, the mean rate stays exact.
    assert starts[-1] - starts[0] == pytest.approx(40 * 0.01, abs=1.1e-3)
    jitter = np.asarray(stats.period_error_s)
    assert len(jitter) == 40 and jitter.max() == pytest.approx(0.001, abs=1e-9)
    assert stats.jitter_ms()[2] == pytest.approx(1.0, abs=1e-6)
    assert stats.missed_deadlines == 0 and stats.overruns == 0


def test_latency_percentiles_and_rate() -> None:
    stats = LoopStats()
    assert all(math.isnan(v) for v in stats.percentiles_ms())
    stats.latency_s.extend(i * 1e-4 for i in range(101))  # 0 .. 10 ms
    p50, p90, p99 = stats.percentiles_ms()
    assert p50 == pytest.approx(5.0) and p90 == pytest.approx(9.0) and p99 == pytest.approx(9.9)
    stats.step_times.extend([0.0, 0.01, 0.02, 0.03])
    assert stats.rate_hz() == pytest.approx(100.0)


def test_wake_runs_an_event_step_at_once_outside_the_period_statistics() -> None:
    period = 0.2  # long: an event step that waited for the deadline would be obvious
    events: list[float] = []
    steps: list[float] = []
    stop = threading.Event()
    loop = ControlLoop(period, steps.append, event_step=events.append)
    worker = threading.Thread(target=loop.run, args=(stop,), kwargs={"max_steps": 3}, daemon=True)
    worker.start()
    while not steps:
        time.sleep(0.001)
    loop.wake()
    deadline = time.monotonic() + 5.0
    while not events and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(events) == 1 and len(steps) == 1  # ran before the next period's step
    worker.join(timeout=5.0)
    assert steps[1] - steps[0] == pytest.approx(period, abs=0.05)  # the period was not shifted
    stats = loop.stats
    assert stats.steps == 3 and stats.event_steps == 1 and len(stats.period_error_s) == 2
    summary = stats.jitter_summary_ms()
    assert set(summary) == {"p50", "p99", "max", "late_p99"} and summary["max"] >= summary["p99"] >= summary["p50"]


def test_watchdog_wakes_the_loop_for_an_event_step_between_periods() -> None:
    """The watchdog names a moment between two periods (an input gap falling due): the sleeping
    loop runs an event step then, before the next period's step, and asks again afterwards."""
    period = 5.0  # long: only the watchdog can explain an event step before the second period
    events: list[float] = []
    steps: list[float] = []
    stop = threading.Event()
    due = [math.inf]

    def step(now: float) -> None:
        steps.append(now)
        due[0] = now + 0.02  # due 20 ms after the first period's step

    def event(now: float) -> None:
        events.append(now)
        due[0] = math.inf  # handled: nothing more is due
        stop.set()

    loop = ControlLoop(period, step, event_step=event, watchdog=lambda: due[0])
    loop.run(stop, max_steps=2)
    assert len(steps) == 1 and len(events) == 1 and events[0] >= steps[0] + 0.02
    assert loop.stats.event_steps == 1


def test_simulation_clock_reached_before_the_step_ends_is_due_not_missed() -> None:
    """A lockstep simulator publishes the next period of /clock as soon as it has the command,
    often before the loop has finished its step. The deadlines are float sums near the epoch
    (integer-nanosecond stamps of about 1.8e9 s), so they drift from that clock by rounding; a
    deadline the clock has just reached must still fire (skipping it left a state unanswered
    until the simulator's timeout), and one whole period of clock jump skips exactly one."""
    from embodied.real.freshness import SimClock

    period_ns = 10_000_000
    clock = SimClock()
    now_ns = [1_796_000_000_123_456_789]

    def publish() -> None:
        clock.on_clock(
            type("Clock", (), {"clock": type("T", (), {"sec": now_ns[0] // 10**9, "nanosec": now_ns[0] % 10**9})})()
        )

    stamps: list[int] = []

    def step(_now_s: float) -> None:
        stamps.append(now_ns[0])
        # the simulator answers at once: one period (two, once) of simulation time before the
        # loop's own bookkeeping runs
        now_ns[0] += period_ns * (2 if len(stamps) == 300 else 1)
        publish()

    publish()
    loop = ControlLoop(period_ns * 1e-9, step, clock, lambda deadline, stop: clock.sleep_until(deadline, stop))
    stop = threading.Event()
    give_up = threading.Timer(20.0, stop.set)  # a skipped due deadline stalls the lockstep forever
    give_up.start()
    try:
        stats = loop.run(stop, max_steps=600)
    finally:
        give_up.cancel()
    gaps = np.diff(stamps) // period_ns
    assert stats.steps == 600 and stats.missed_deadlines == 1
    assert gaps.tolist() == [1] * 299 + [2] + [1] * 299
