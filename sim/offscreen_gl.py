"""Which OpenGL platform MuJoCo's offscreen renderer uses, chosen before ``mujoco`` is imported.

MuJoCo's Python bindings read ``MUJOCO_GL`` once, when ``mujoco`` is first imported; unset on
Linux they pick GLFW, which needs a display. Headless machines render through EGL (Mesa's
``libegl1`` + ``libegl-mesa0``, llvmpipe in software when there is no GPU) or OSMesa
(``libosmesa6``). :func:`default_mujoco_gl` fills ``MUJOCO_GL`` with the first of those whose
library is installed, and never overrides a value the user set. Only the standard library is
imported here, so ``embodied.sim`` can call it on import at no cost.
"""

from __future__ import annotations

import ctypes.util
import os
import platform

GL_PLATFORMS: tuple[tuple[str, str, str], ...] = (
    ("egl", "EGL", "libegl1 libegl-mesa0"),
    ("osmesa", "OSMesa", "libosmesa6"),
)
"""``(MUJOCO_GL value, shared library name, Debian packages providing it)``, in order of preference."""


def gl_install_hint() -> str:
    """The Debian packages that give MuJoCo an offscreen GL platform (for error messages)."""
    return " or ".join(f"apt-get install {packages} (MUJOCO_GL={name})" for name, _, packages in GL_PLATFORMS)


def available_gl_platform() -> str | None:
    """The first of :data:`GL_PLATFORMS` whose library the dynamic loader finds, or None."""
    for name, library, _ in GL_PLATFORMS:
        if ctypes.util.find_library(library) is not None:
            return name
    return None


def default_mujoco_gl() -> str | None:
    """Set ``MUJOCO_GL`` (Linux, when unset) to :func:`available_gl_platform`; return its value."""
    if "MUJOCO_GL" not in os.environ and platform.system() == "Linux":
        found = available_gl_platform()
        if found is not None:
            os.environ["MUJOCO_GL"] = found
    return os.environ.get("MUJOCO_GL")
