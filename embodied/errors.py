"""User-facing error types: the CLI prints their message (no traceback) and exits with code 2."""

from __future__ import annotations


class EmbodiedError(RuntimeError):
    """A failure the user can fix; the message names the file, key or value and the expected form."""


class NonFiniteError(EmbodiedError):
    """A NaN or inf appeared; the message says where (observation group, reward, loss name)."""
