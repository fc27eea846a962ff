"""Scheduling of the control-loop thread: timer slack, real-time priority, garbage collector.

A 100 Hz loop on a loaded 2-core machine is late mostly for three reasons: the kernel rounds its
sleeps up by the thread's timer slack (50 us by default), the thread waits behind busy processes
of the same (CFS) class after its timer fires, and Python's cyclic garbage collector can pause a
step for milliseconds. :func:`tune_loop_thread` sets the slack to 1 us (``prctl``), asks for
``SCHED_FIFO`` at the given priority (allowed for root or with an ``rtprio`` limit; otherwise it
logs once and keeps the normal class) and :func:`freeze_gc` moves everything allocated during
warm-up out of the collector's reach.

:class:`SignalWatcher` takes SIGTERM/SIGINT off the main thread for the same reason.

Linux only; elsewhere each step is skipped and says so in the returned description.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

PR_SET_TIMERSLACK = 29
"""``prctl`` option (linux/prctl.h): this thread's timer slack in nanoseconds."""
TIMER_SLACK_NS = 1_000
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def set_timer_slack(slack_ns: int = TIMER_SLACK_NS) -> bool:
    """Set the calling thread's timer slack; False where ``prctl`` is unavailable or refuses."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        _warn_once("slack", "cannot set the control loop's timer slack (prctl); sleeps may wake up to 50 us late")
    return ok


def set_realtime_priority(priority: int) -> bool:
    """``SCHED_FIFO`` at ``priority`` (1-99) for the calling thread; 0 keeps the normal class.

    Falls back (logged once) when not permitted: run as root, or give the user an ``rtprio``
    limit (``/etc/security/limits.conf``: ``@realtime - rtprio 98``) or ``CAP_SYS_NICE``.
    """
    if priority <= 0:
        return False
    if not hasattr(os, "sched_setscheduler"):
        _warn_once("fifo", "no SCHED_FIFO on this platform; the control loop runs in the normal class")
        return False
    try:
        # pid 0 is the calling thread on Linux (scheduling is per thread).
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError) as err:
        _warn_once(
            "fifo",
            "SCHED_FIFO priority %d refused (%s): the control loop runs in the normal class and busy "
            "processes can delay it; allow it with an rtprio limit or CAP_SYS_NICE",
            priority,
            err,
        )
        return False
    return True


def tune_loop_thread(priority: int) -> str:
    """Timer slack and real-time priority for the calling (loop) thread; a short description
    (``"SCHED_FIFO 10, slack 1 us"``) for logs and ``/diagnostics``."""
    slack = set_timer_slack()
    fifo = set_realtime_priority(priority)
    description = (f"SCHED_FIFO {priority}" if fifo else "normal") + (", slack 1 us" if slack else "")
    log.info("control loop thread: %s", description)
    return description


@dataclass(frozen=True)
class Priorities:
    """``SCHED_FIFO`` priorities of a real-time node's threads (0: normal scheduling)."""

    process: int
    loop: int
    signals: int


SWITCH_INTERVAL_S = 0.0005
"""Interpreter-lock hand-over interval of a real-time process (Python's default is 5 ms)."""


def realtime_process(priority: int) -> Priorities:
    """Put the calling thread, and so every thread it starts later, at ``SCHED_FIFO`` ``priority``.

    Call it first thing, before the middleware and onnxruntime start their threads: threads
    inherit their creator's policy, and so do child processes (start none that may busy-loop). All of the process's threads, not just the loop, must be
    real-time: a thread of the normal class that holds the interpreter lock when busy processes
    preempt it would stall the loop (and the signal thread) for as long as it waits for a CPU,
    tens to hundreds of ms on a loaded 2-core machine. The loop runs one level above the rest and
    the signal thread two, and the lock is handed over every :data:`SWITCH_INTERVAL_S`.
    """
    if priority <= 0 or not set_realtime_priority(priority):
        return Priorities(0, 0, 0)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return Priorities(priority, min(priority + 1, 99), min(priority + 2, 99))


def freeze_gc() -> None:
    """Move every object alive now to the permanent generation: the collector then scans only
    what the loop allocates afterwards (short-lived arrays), so its pauses stay short."""
    gc.collect()
    gc.freeze()


EXIT_GRACE_S = 10.0
"""How long a node may take to close once its control loop ended (middleware teardown, the
interpreter's exit) before :func:`arm_exit_guard` ends the process."""


def arm_exit_guard(grace_s: float = EXIT_GRACE_S) -> None:
    """End this process ``grace_s`` from now unless it exits by itself first; call it once the
    final safe command went out.

    A process manager's SIGTERM, or Ctrl-C, must end the node, but teardown runs through code
    the node does not own (Cyclone DDS deleting its participant while listener threads deliver,
    native threads at the interpreter's exit). If anything there blocks, the timer (a native
    thread of ``faulthandler``: it needs no interpreter lock, so a thread stuck holding it does
    not stop it) writes every Python thread's stack to stderr, for a report, and exits with
    status 1. The robot side is already safe at this point: the safe command was the last one.
    """
    faulthandler.dump_traceback_later(grace_s, exit=True)


class SignalWatcher:
    """SIGTERM/SIGINT handled on a dedicated thread at real-time priority (self-pipe).

    A Python signal handler runs only in the main thread, between bytecodes: on a loaded machine
    that thread may wait for a CPU (and then for the interpreter lock) for tens of milliseconds
    before the safe command can go out. Here the interpreter's C-level handler, in whichever
    thread the kernel picked, writes the signal number to a pipe (``signal.set_wakeup_fd``); the
    watcher thread blocks on that pipe and, at ``priority`` (``SCHED_FIFO``), runs the moment a
    signal arrives. ``handler(name)`` is set once the node exists; a signal before that is kept
    and handled then, or raised again by :meth:`close` if no handler came. Create it in the main
    thread; :meth:`close` restores the previous handlers.
    """

    def __init__(self, signals: tuple[signal.Signals, ...], priority: int) -> None:
        self.signals = tuple(signals)
        self._priority = priority
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._lock = threading.Lock()
        self._handler: Callable[[str], None] | None = None
        self._pending: int | None = None
        # The Python-level handler does nothing: the pipe carries the signal to the watcher.
        self._previous = {s: signal.signal(s, lambda *_: None) for s in self.signals}
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="signals", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        set_realtime_priority(self._priority)
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return  # closed
            if not data:
                return
            for signum in data:
                if signum not in self.signals:
                    continue
                with self._lock:
                    handler = self._handler
                    if handler is None:
                        self._pending = signum
                        continue
                handler(signal.Signals(signum).name)

    def set_handler(self, handler: Callable[[str], None]) -> None:
        with self._lock:
            self._handler = handler
            pending, self._pending = self._pending, None
        if pending is not None:
            handler(signal.Signals(pending).name)

    def close(self) -> None:
        """Restore the previous handlers (re-raising a signal nobody handled)."""
        signal.set_wakeup_fd(self._previous_fd)
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        with self._lock:
            pending, self._pending = self._pending, None
            self._handler = lambda _name: None
        os.close(self._write_fd)  # the watcher reads EOF and ends
        if pending is not None:
            signal.raise_signal(pending)
