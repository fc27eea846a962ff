"""The fixed-rate control loop: absolute deadlines, overrun accounting, no catch-up bursts, and
the latency statistics behind the live status line."""

from __future__ import annotations

import math
import threading
import time

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


def test_input_trigger_steps_on_events_and_on_silence() -> None:
    # Load-independent: with a one-hour period, every step the loop takes while the test runs
    # was caused by a trigger; a loop that waited for its period would never finish (the join
    # below is only a hang guard, far longer than a triggered step needs).
    trigger = threading.Event()
    stepped = threading.Semaphore(0)
    loop = ControlLoop(3600.0, lambda now: stepped.release(), trigger=trigger)
    worker = threading.Thread(target=loop.run, args=(threading.Event(),), kwargs={"max_steps": 3}, daemon=True)
    worker.start()
    for _ in range(3):
        trigger.set()
        assert stepped.acquire(timeout=600.0), "a trigger did not step the loop"
    worker.join(timeout=600.0)
    assert not worker.is_alive() and loop.stats.steps == 3

    # Silence: without any trigger the loop still steps once per period (the watchdog needs it).
    silent = ControlLoop(0.01, lambda now: None, trigger=threading.Event())
    assert silent.run(threading.Event(), max_steps=3).steps == 3


def test_latency_percentiles_and_rate() -> None:
    stats = LoopStats()
    assert all(math.isnan(v) for v in stats.percentiles_ms())
    stats.latency_s.extend(i * 1e-4 for i in range(101))  # 0 .. 10 ms
    p50, p90, p99 = stats.percentiles_ms()
    assert p50 == pytest.approx(5.0) and p90 == pytest.approx(9.0) and p99 == pytest.approx(9.9)
    stats.step_times.extend([0.0, 0.01, 0.02, 0.03])
    assert stats.rate_hz() == pytest.approx(100.0)
