"""Simulator backends (``embodied.sim``): one file each; heavy imports stay inside them.

Importing the package picks MuJoCo's headless GL platform (EGL, else OSMesa) unless
``MUJOCO_GL`` is set, because MuJoCo reads it once on its first import
(:mod:`embodied.sim.offscreen_gl`).
"""

from embodied.sim.offscreen_gl import default_mujoco_gl

default_mujoco_gl()
