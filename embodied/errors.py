"""User-facing error types: the CLI prints their message (no traceback) and exits with code 2."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from types import ModuleType


class EmbodiedError(RuntimeError):
    """A failure the user can fix; the message names the file, key or value and the expected form."""


class NonFiniteError(EmbodiedError):
    """A NaN or inf appeared; the message says where (observation group, reward, loss name)."""


class DegenerateRunError(EmbodiedError):
    """Every episode ends at its first step (diverged physics, an absurd config): nothing to learn."""


class MissingDependencyError(EmbodiedError):
    """An optional dependency (a simulator backend, an exporter) is not installed; the message
    says what to install, e.g. ``pip install "embodied[mjwarp]"``."""


def import_optional(module: str, needed_for: str, install: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming ``install``.

    ``needed_for`` says what wanted it (``"the mjwarp backend"``); ``install`` is the command or
    environment that provides it (``'pip install "embodied[mjwarp]"'``). A module that is present
    but fails to import (a broken build) is reported the same way, with the original reason.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{needed_for} needs the {module!r} package ({err}); install it with: {install}"
        ) from err


def absent_modules(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` whose files are not found (checked without importing them)."""
    out = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package absent, or a module set to None
            found = False
        if not found:
            out.append(module)
    return out
