"""Simulation time: a tick waits for the state its simulator published just before the clock.

A lockstep simulator publishes the state of a step, then the ``/clock`` period it belongs to.
The two travel on different topics, and DDS orders messages per writer only (a best-effort
sensor topic and a reliable clock even take different delivery paths), so now and then the clock
overtakes the state. A node ticking at that moment samples the previous state: its input is two
periods old on simulation time, which is an input gap (the hold command goes out and enters the
action history) and an answer to the wrong state. Nothing of that happens on a real robot.

So on simulation time the node learns how far the stamped input lags the clock at a tick (one
period for ``embodied sim-robot``); when an input that arrives once per period lags further, the
state for this tick is in flight, and the tick waits for it, up to :data:`WAIT_S` of wall time
(simulation time does not move meanwhile: the simulator waits for the answer). A timeout
falls back to the old behaviour (the tick samples what it has; the gap hold answers) and stops
the waiting until the input comes back, so a simulator that stopped publishing costs one wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from embodied.real.freshness import InputGate

log = logging.getLogger(__name__)

WAIT_S = 1.5
"""Wall time a tick waits for a state in flight: beyond the scheduler stalls of a loaded 2-core
machine (typically 100-150 ms; a CI run of the DDS closed-loop test on a shared 2-core VM saw
one over 0.5 s, the earlier value), and below the simulator's own wait for an answer
(``sim_robot.COMMAND_TIMEOUT_S``, 2 s), so that after a stall between the two the simulator
still gets an answer (the hold) before it gives up."""
_SLICE_S = 0.01
"""The wait re-checks ``cancelled`` this often (wake-ups come from signal handlers too, which
must not take the node's lock to notify)."""


class PeriodInputWait:
    """Waits, before a tick on simulation time, for the ``gate``'s message of that period.

    ``arrived`` must be the condition the node notifies when a message is accepted, over the lock
    that guards ``gate``.
    """

    def __init__(self, gate: InputGate, period_s: float, arrived: threading.Condition, wait_s: float = WAIT_S) -> None:
        self.gate = gate
        self.period_s = period_s
        self.wait_s = wait_s
        self._arrived = arrived
        self._lag_s: float | None = None
        """Clock minus the newest stamp at the last tick that had a new message (None: not learned)."""
        self._accepted_at_tick = -1
        self.waits = 0
        """Ticks that waited for their state (it arrived)."""
        self.timeouts = 0
        """Ticks whose state did not arrive within :attr:`wait_s`."""

    def _synchronous(self) -> bool:
        """The input arrives once per control period (its last two stamps are a period apart)."""
        latest, previous = self.gate.latest, self.gate.previous_stamp_ns
        if latest is None or latest.stamp_ns is None or previous is None:
            return False
        return abs((latest.stamp_ns - previous) * 1e-9 - self.period_s) < 1e-6

    def before_tick(self, clock_s: Callable[[], float], cancelled: Callable[[], bool]) -> None:
        """Called when simulation time ``clock_s()`` reached a tick; returns when the tick may sample."""
        with self._arrived:
            latest, now_s = self.gate.latest, clock_s()
            if latest is None or latest.stamp_s is None:
                return
            in_flight = (
                self._lag_s is not None
                and now_s - latest.stamp_s > self._lag_s + 0.5 * self.period_s
                and self._synchronous()
            )
            if in_flight:
                self._wait(now_s, cancelled)
            elif self.gate.accepted != self._accepted_at_tick:
                # Learned on ticks that did not wait only: after a wait the clock may have moved on
                # (a simulator that does not wait for the node), so the lag then says nothing.
                self._lag_s = now_s - latest.stamp_s
            self._accepted_at_tick = self.gate.accepted

    def _wait(self, now_s: float, cancelled: Callable[[], bool]) -> None:
        """Wait (holding ``arrived``) until the gate accepts a message, or :attr:`wait_s` passed."""
        accepted = self.gate.accepted
        give_up = time.monotonic() + self.wait_s
        while self.gate.accepted == accepted and not cancelled():
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.wait(min(_SLICE_S, remaining))
        if self.gate.accepted != accepted:
            self.waits += 1
        elif not cancelled():
            self.timeouts += 1
            self._lag_s = None  # no more waits until the input is back
            log.warning(
                "%s: its state for simulation time %.3f did not arrive within %.1f s of wall time; "
                "the tick samples the previous one",
                self.gate.cfg.name,
                now_s,
                self.wait_s,
            )
