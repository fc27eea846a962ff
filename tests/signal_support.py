"""A signal handler installed for the duration of a ``with`` block, then the previous one put back."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int


@contextlib.contextmanager
def signal_handler(signum: signal.Signals, handler: Handler) -> Iterator[None]:
    """Install ``handler`` for ``signum`` (``signal.default_int_handler`` makes the signal raise
    ``KeyboardInterrupt`` even in a test run started as a background job, which inherits Ctrl-C
    ignored; ``signal.SIG_IGN`` ignores it) and restore the previous handler afterwards."""
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)
