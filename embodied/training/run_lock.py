"""An exclusive lock on a run directory, held for the life of the process that writes it.

``RUN_DIR/.lock`` is locked with ``fcntl.flock`` (advisory, released by the kernel when the
process dies, however it dies) and holds ``pid host`` of the holder. A second ``train`` or
``--resume`` of the same folder fails at once naming the holder. A lock file whose holder is
gone is taken over with a log line naming the dead holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from pathlib import Path
from types import TracebackType

from embodied.errors import EmbodiedError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunLockedError(EmbodiedError):
    """Another live process holds the run directory."""


class RunLock:
    """``with RunLock(run_dir):`` holds ``run_dir/.lock`` exclusively (see module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> RunLock:
        if self.held:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise EmbodiedError(f"{self.path}: cannot create the run lock: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent}: in use by another process ({holder or 'holder unknown'}); "
                "wait for it to finish or stop it first"
            ) from None
        except OSError as err:
            os.close(fd)
            raise EmbodiedError(f"{self.path}: cannot lock the run directory: {err.strerror or err}") from None
        previous = _read_holder(fd)
        if previous:
            log.warning("%s: took over a stale lock of %s (that process no longer runs)", self.path.parent, previous)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
        except OSError as err:
            os.close(fd)
            raise EmbodiedError(f"{self.path}: cannot write the run lock: {err.strerror or err}") from None
        self._fd = fd
        return self

    def release(self) -> None:
        if not self.held:
            return
        # An empty lock file: the folder was released cleanly (on a full or read-only disk the
        # truncation fails, and the kernel still drops the lock at close).
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
