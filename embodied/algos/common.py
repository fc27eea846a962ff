"""Small helpers shared by several algorithms."""

from __future__ import annotations

from embodied.config import ConfigError
from embodied.env import IMAGE_GROUP, VecEnv


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


def image_input_shape(env: VecEnv, encoder: str, algo_name: str) -> tuple[int, ...] | None:
    """``(H, W, 3)`` of the env's ``"image"`` group when ``encoder == "cnn"``, else None.

    A CNN encoder on an env without camera images is a configuration error that names the fix."""
    if encoder != "cnn":
        return None
    if IMAGE_GROUP not in env.obs_spec:
        raise ConfigError(
            f"{algo_name}: algo.encoder=cnn needs camera images, but the env has no {IMAGE_GROUP!r} observation "
            f"group (it has {', '.join(sorted(env.obs_spec))}); turn a camera on, e.g. env.backend.camera=top"
        )
    return tuple(int(v) for v in env.obs_spec[IMAGE_GROUP])


ENCODERS = ("mlp", "cnn")
"""Values of ``algo.encoder``: ``mlp`` reads the observation vector only, ``cnn`` camera images too."""


def check_image_encoder(encoder: str, image_features: int, owner: str) -> None:
    """Raise a :class:`ConfigError` naming ``owner`` (e.g. ``PPOCfg``, ``algo``) unless ``encoder``
    is one of :data:`ENCODERS` and ``image_features >= 1``."""
    if encoder not in ENCODERS:
        raise ConfigError(f"{owner}.encoder must be 'mlp' or 'cnn', got {encoder!r}")
    if image_features < 1:
        raise ConfigError(f"{owner}.image_features must be >= 1, got {image_features}")
