"""Camera images of a MuJoCo batch: one offscreen renderer, reused for every simulation.

MuJoCo renders one ``mjData`` at a time, so :class:`BatchCamera` keeps one ``mujoco.Renderer``
and one scratch ``mjData``: per simulation it loads that row of the batch's state
(``mj_setState``), recomputes positions (``mj_kinematics``, ``mj_comPos``, ``mj_camlight``: what
the scene needs, no dynamics or collisions), updates the scene from the named camera and reads
the pixels. The scratch data never feeds back into the physics. Appearance comes from the
nominal model: per-env mass or friction randomization changes no colour or geometry.

GL: ``embodied.sim`` picks EGL or OSMesa before ``mujoco`` is imported
(:mod:`embodied.sim.offscreen_gl`); a machine with neither fails here with the packages to
install.

Shapes: ``N`` = simulations, ``H = W`` = ``size_px``; images are ``[N, H, W, 3]`` uint8 RGB,
row 0 at the top of the picture.
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np

from embodied.config import ConfigError
from embodied.errors import MissingDependencyError
from embodied.sim.offscreen_gl import gl_install_hint


def camera_names(model: mujoco.MjModel) -> list[str]:
    """Names of the model's cameras, in id order."""
    return [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) or f"#{i}" for i in range(model.ncam)]


class BatchCamera:
    """Renders camera ``camera`` of ``model`` for rows of a batch state (``mjSTATE_INTEGRATION``)."""

    def __init__(self, model: mujoco.MjModel, camera: str, size_px: int) -> None:
        self.camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if self.camera_id < 0:
            names = ", ".join(camera_names(model)) or "none"
            raise ConfigError(f"the model has no camera {camera!r} (its cameras: {names})")
        if size_px > min(model.vis.global_.offwidth, model.vis.global_.offheight):
            raise ConfigError(
                f"image size {size_px} px exceeds the model's offscreen buffer "
                f"({model.vis.global_.offwidth}x{model.vis.global_.offheight}; raise <visual><global offwidth/offheight>)"
            )
        self.model = model
        self.camera = camera
        self.size_px = int(size_px)
        self.data = mujoco.MjData(model)
        self._spec = int(mujoco.mjtState.mjSTATE_INTEGRATION)
        try:
            self.renderer = mujoco.Renderer(model, self.size_px, self.size_px)
        except Exception as err:  # GL failures surface as AttributeError, FatalError, OSError, ...
            raise MissingDependencyError(
                f"MuJoCo cannot open an offscreen GL context ({type(err).__name__}: {err}); "
                f"install one: {gl_install_hint()}"
            ) from None

    def render(self, state: np.ndarray, ids: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Images ``[n, H, W, 3]`` uint8 of rows ``ids`` (all rows if None) of ``state`` ``[N, nstate]``."""
        rows = range(len(state)) if ids is None else [int(i) for i in ids]
        out = np.empty((len(rows), self.size_px, self.size_px, 3), dtype=np.uint8)
        m, d = self.model, self.data
        for k, i in enumerate(rows):
            mujoco.mj_setState(m, d, state[i], self._spec)
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)  # tracking cameras and lights read subtree centres of mass
            mujoco.mj_camlight(m, d)
            self.renderer.update_scene(d, self.camera_id)
            self.renderer.render(out=out[k])
        return out

    def close(self) -> None:
        self.renderer.close()
