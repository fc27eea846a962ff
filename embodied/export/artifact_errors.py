"""The policy artifact's error type, in its own module so that the description modules of each
artifact kind (``flow_arrays``, ``image_arrays``, ...) can raise it without importing
:mod:`embodied.export.artifact`, which imports them."""

from __future__ import annotations

from embodied.errors import EmbodiedError


class PolicyArtifactError(EmbodiedError):
    """A policy artifact is missing, damaged, or not one this version reads."""
