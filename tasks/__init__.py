"""Tasks (``embodied.tasks``): observation, reward, terminations and randomization, one file each.

Task modules import ``mujoco`` before ``embodied.sim``; importing ``embodied.sim`` here first
lets it choose MuJoCo's headless GL platform while that choice is still open
(:mod:`embodied.sim.offscreen_gl`).
"""

import embodied.sim  # noqa: F401  (import side effect: sets MUJOCO_GL when unset)
