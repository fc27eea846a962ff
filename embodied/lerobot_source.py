"""``lerobot:<hub id or folder>``: how a LeRobot checkpoint is named on the command line.

Torch-free, so the deploy side (``embodied.real``) reads the same rule as training and evaluation.
"""

from __future__ import annotations

from pathlib import Path

from embodied.errors import EmbodiedError

LEROBOT_SOURCE_PREFIX = "lerobot:"
"""The prefix ``--base``, ``eval`` and ``deploy`` take for a LeRobot checkpoint."""


def is_lerobot_source(source: str | Path | None) -> bool:
    """True for ``lerobot:<hub id or folder>``."""
    return source is not None and str(source).startswith(LEROBOT_SOURCE_PREFIX)


def lerobot_reference(source: str | Path) -> str:
    """The hub id or folder of ``lerobot:<ref>`` (an error when empty)."""
    ref = str(source)[len(LEROBOT_SOURCE_PREFIX) :]
    if not ref:
        raise EmbodiedError(
            "lerobot: needs a Hub id or a folder, e.g. lerobot:lerobot/smolvla_base or lerobot:outputs/act/pretrained_model"
        )
    return ref
