"""A run's task config for flying a trained policy, not training it (export, ``embodied verify``).

A run trained with ``env.sim.compile: true`` (the quad-hover default) would otherwise compile a
fused step for every distinct task config and batch size these build (export's recording,
verify's own task, its trajectory plot), about 50 s each on a cold cache, where the eager step
runs the same physics to float rounding and costs a fraction of that over their few thousand
episodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _replace_present(cfg: Any, values: dict[str, Any]) -> Any:
    """``dataclasses.replace`` with the entries of ``values`` that are fields of ``cfg`` (else ``cfg``)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        return cfg
    names = {f.name for f in dataclasses.fields(cfg)}
    present = {k: v for k, v in values.items() if k in names}
    return dataclasses.replace(cfg, **present) if present else cfg


def eager_task_cfg(task_cfg: Any) -> Any:
    """The task config with its simulator's ``compile`` off (configs without one unchanged)."""
    sim = getattr(task_cfg, "sim", None)
    if sim is None:
        return task_cfg
    return _replace_present(task_cfg, {"sim": _replace_present(sim, {"compile": False})})


def quiet_task_cfg(task_cfg: Any) -> Any:
    """The eager task config without observation noise and disturbances (fields left alone if absent)."""
    quiet = {"obs_noise_std": (0.0, 0.0, 0.0, 0.0), "disturbance_force_std_n": 0.0, "disturbance_torque_std_nm": 0.0}
    return _replace_present(eager_task_cfg(task_cfg), quiet)
