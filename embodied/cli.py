"""The ``embodied`` command line: one module per subcommand in ``embodied.commands``.

Each command module exposes ``register(subparsers) -> None``, which adds its parser and sets
``func`` (called with the parsed namespace, returning an exit code). Imports of heavy
dependencies happen inside ``func`` so ``embodied --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from embodied.config import ConfigError
from embodied.errors import EmbodiedError
from embodied.stop import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    clear_pending_stop,
    pending_stop,
    raise_stop,
    stop_exception,
)

COMMAND_MODULES: tuple[str, ...] = (
    "train",
    "eval",
    "play",
    "sweep",
    "list",
    "bench",
    "export",
    "firmware",
    "flash",
    "verify",
    "collect",
    "deploy",
    "sim_robot",
)
"""Modules of ``embodied.commands``, in the order ``--help`` lists them."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``embodied train: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command_module(argv: Sequence[str]) -> str | None:
    """The command module ``argv`` names (``sim-robot`` -> ``sim_robot``), or None when its first
    word is an option or no known command (then every command is registered, so ``--help`` and the
    "invalid choice" error list them all)."""
    words = [w for w in argv if w not in ("-v", "--verbose")]
    if not words or words[0].startswith("-"):
        return None
    name = words[0].replace("-", "_")
    return name if name in COMMAND_MODULES else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of the module ``only``: registering a command can
    import what its flags need (``export``'s format table imports torch), and a command such as
    ``flash`` with no radio must answer within seconds."""
    parser = OneLineErrorParser(
        prog="embodied",
        description="Sim-to-real reinforcement learning: train, evaluate, export and deploy robot policies.",
        epilog="Start with: embodied train quad-hover   (CPU, a few seconds). Every subcommand has its own --help.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES if only is None else (only,):
        importlib.import_module(f"embodied.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (0 ok, 2 bad input, 130 Ctrl-C, 143 SIGTERM)."""
    # Only the main thread may set handlers (tests and notebooks may call main() from others).
    # Set before the command modules import torch, so a stop during start-up exits cleanly too.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[signal.Signals, Any] = {}
    if in_main_thread:
        clear_pending_stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if handler is not signal.SIG_IGN and handler is not None:  # ignored stays ignored
                previous[signum] = signal.signal(signum, raise_stop)
    try:
        code = _run(argv)
        stopped = pending_stop()
        if stopped is not None:  # the stop's exception was swallowed, yet the command ended
            raise stop_exception(stopped)
        return code
    except (ConfigError, EmbodiedError) as err:
        logging.getLogger("embodied").error("%s", err)
        return 2
    except OSError as err:
        # A full disk, a read-only or missing folder: name the path, no traceback.
        where = f"{err.filename}: " if err.filename else ""
        logging.getLogger("embodied").error("%s%s", where, err.strerror or err)
        return 2
    except Terminated:
        logging.getLogger("embodied").warning("terminated (SIGTERM)")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        logging.getLogger("embodied").warning("interrupted")
        return EXIT_INTERRUPTED
    finally:
        clear_pending_stop()  # handled here: a later run in this process must not see it
        for restored, handler in previous.items():
            signal.signal(restored, handler)


def _run(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_module(words))
    # key=value overrides may come after options (``--seed 1 algo.lr=3e-4``); argparse stops
    # collecting a positional list at the first option, so gather the stragglers here.
    args, extras = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `train --nproc` hands to each process
    if extras:
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extras):
            args.overrides = list(args.overrides or []) + extras
        else:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
