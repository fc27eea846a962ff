"""Stop requests (Ctrl-C, SIGTERM) that a long loop honours at a point where its state is whole.

Outside :func:`deferred_stop` a signal stops the program at once: Python raises
``KeyboardInterrupt`` for Ctrl-C and the CLI raises :class:`Terminated` for SIGTERM. Inside it,
the first signal only records the request; the loop polls :attr:`StopRequest.signum` between
iterations, writes a checkpoint and calls :meth:`StopRequest.raise_now`. A second signal raises
at once, so a step that hangs can still be stopped. Preempted cluster jobs get SIGTERM and a few
seconds of grace: that is enough for one iteration and one checkpoint, so no progress is lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""Shell conventions (128 + signal number) for Ctrl-C and SIGTERM."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a cluster scheduler's preemption) unwinds like Ctrl-C: the run keeps
    its checkpoint and ``embodied train --resume`` continues from it."""


def stop_exception(signum: int) -> KeyboardInterrupt:
    """The exception that stands for ``signum``: :class:`Terminated` for SIGTERM, else Ctrl-C's."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


_pending: int | None = None
"""A stop signal received outside :func:`deferred_stop` (see :func:`raise_stop`)."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM handler outside :func:`deferred_stop`: unwind at once."""
    raise_stop(signum, frame)


def raise_stop(signum: int, frame: FrameType | None) -> None:
    """Handler for Ctrl-C and SIGTERM outside :func:`deferred_stop`: remember the signal, then
    unwind at once. Remembering matters when third-party code swallows the exception (a bare
    ``except:`` in an import): the next :func:`deferred_stop` then honours the request at its
    first whole state instead of losing it, and :func:`pending_stop` reports it."""
    global _pending
    _pending = signum
    raise stop_exception(signum)


def pending_stop() -> int | None:
    """The signal :func:`raise_stop` recorded since the last :func:`clear_pending_stop`."""
    return _pending


def clear_pending_stop() -> None:
    global _pending
    _pending = None


class StopRequest:
    """The first stop signal received inside :func:`deferred_stop` (``None``: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def raise_now(self) -> None:
        """Raise the exception of the recorded signal (no-op when none was recorded)."""
        if self.signum is not None:
            raise stop_exception(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise stop_exception(signum)
        self.signum = signum
        log.warning(
            "%s received: stopping after the current step and writing a checkpoint (send it again to stop at once)",
            signal.Signals(signum).name,
        )


@contextlib.contextmanager
def deferred_stop() -> Iterator[StopRequest]:
    """Record Ctrl-C and SIGTERM instead of raising; restore the previous handlers on exit.

    Signals that were ignored (a job started in the background ignores Ctrl-C) stay ignored, and
    handlers set from C are left alone. Outside the main thread Python cannot set handlers: the
    request then never fires and signals behave as they did before.
    """
    request = StopRequest()
    request.signum = _pending  # a stop whose exception something swallowed on the way here
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        # None: a handler set from C, which could not be put back from Python afterwards.
        if handler is signal.SIG_IGN or handler is None:
            continue
        previous[signum] = handler
        signal.signal(signum, request._handle)
    try:
        yield request
    finally:
        for restored, handler in previous.items():
            signal.signal(restored, handler)
