"""``embodied train --nproc N``: start ``N`` training processes on this machine through
``torch.distributed.run`` (torchrun), with the same command line minus ``--nproc``.

The launcher runs in its own session, so a Ctrl-C or SIGTERM reaches it only through this
process, which forwards it once; torchrun hands it to every rank, and the ranks checkpoint the
same step and stop (:mod:`embodied.training.trainer`).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Sequence

from embodied.stop import Terminated

log = logging.getLogger(__name__)

NPROC_FLAG = "--nproc"


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N`` (the ranks must not launch again)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == NPROC_FLAG:
            skip = True
        elif not arg.startswith(NPROC_FLAG + "="):
            out.append(arg)
    return out


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """The command that runs ``embodied <argv>`` in ``nproc`` local processes (a free port is
    picked by torchrun's standalone rendezvous)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "embodied",
        *without_nproc(argv),
    ]


def launch_local(nproc: int, argv: Sequence[str]) -> int:
    """Run :func:`torchrun_command` and return its exit code; stop signals are forwarded."""
    command = torchrun_command(nproc, argv)
    log.info("starting %d training processes: %s", nproc, " ".join(command))
    proc = subprocess.Popen(command, start_new_session=True)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt as stop:  # Ctrl-C or (Terminated) SIGTERM, see embodied.stop
            proc.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
            log.warning("stop forwarded to the training processes; waiting for their checkpoint")
