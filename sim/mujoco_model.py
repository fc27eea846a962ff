"""Load an MJCF model with MuJoCo's compiler warnings sent to ``logging``.

MuJoCo's default warning handler prints to stdout and appends to ``MUJOCO_LOG.TXT`` in the
working directory: with mujoco 4.0, every load of gymnasium's ``half_cheetah.xml`` (its
deprecated ``settotalmass`` attribute) left that file beside the user's runs. Here each
distinct warning of a model file is logged once per process instead.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import mujoco

log = logging.getLogger(__name__)

_LOGGED: set[tuple[str, str]] = set()
_HANDLER_LOCK = threading.Lock()
"""MuJoCo's warning handler is process-wide: one load swaps it at a time."""


def load_mjcf(path: Path) -> mujoco.MjModel:
    """``mujoco.MjModel.from_xml_path(path)``; its warnings are logged (each once per process)."""
    if not hasattr(mujoco, "get_mju_user_warning"):  # a binding without handler access: MuJoCo's own
        return mujoco.MjModel.from_xml_path(str(path))
    messages: list[str] = []
    with _HANDLER_LOCK:
        previous = mujoco.get_mju_user_warning()
        mujoco.set_mju_user_warning(messages.append)
        try:
            model = mujoco.MjModel.from_xml_path(str(path))
        finally:
            mujoco.set_mju_user_warning(previous)
    for message in messages:
        key = (str(path), message)
        if key not in _LOGGED:
            _LOGGED.add(key)
            log.warning("MuJoCo, loading %s: %s", path, message)
    return model
