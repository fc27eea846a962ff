"""Small helpers shared by several algorithms."""

from __future__ import annotations

from embodied.config import ConfigError
from embodied.env import VecEnv


def resolve_init_action_mean(spec: tuple[float, ...] | str | None, env: VecEnv) -> tuple[float, ...] | None:
    """The initial mean action as numbers ``[action_dim]``.

    ``spec`` is a tuple from the config, ``None`` (no override), or the name of a key in the env's
    ``io_spec().extra`` (e.g. ``"hover_action"``); a scalar there is repeated for every action.
    """
    if spec is None or isinstance(spec, tuple):
        return spec
    extra = env.io_spec().extra
    if spec not in extra:
        raise ConfigError(
            f"algo.init_action_mean names {spec!r}, but the env's io_spec().extra has only: "
            + (", ".join(sorted(extra)) or "(nothing)")
        )
    values = extra[spec]
    if isinstance(values, int | float):
        values = [float(values)] * env.action_dim
    return tuple(float(v) for v in values)
