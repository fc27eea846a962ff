"""``--base lerobot:<hub id or folder>``: a LeRobot ``PreTrainedPolicy`` as an embodied policy.

The checkpoint is loaded by LeRobot's own code, as ``lerobot-eval`` loads it:
``PreTrainedConfig.from_pretrained`` (its ``type`` picks the class through
``lerobot.policies.factory.get_policy_class``), ``<Class>.from_pretrained``, and
``make_pre_post_processors(config, pretrained_path=...)`` for the checkpoint's saved processor
pipelines (normalization, tokenization, image handling, device). A Hub id is resolved by
``huggingface_hub`` (its cache; nothing is fetched under ``HF_HUB_OFFLINE=1``).

The env's observations reach the policy's declared ``input_features`` through the task's row
of :data:`embodied.data.lerobot_format.LEROBOT_TASKS` (state group, cameras, instruction). Every
declared feature must be provided with the declared shape and nothing undeclared may be
provided; a mismatch is a :class:`LeRobotFeatureError` naming the feature and both shapes.
Actions come from the policy's own ``select_action`` queue, so chunks follow the checkpoint's
``chunk_size``/``n_action_steps`` (and a diffusion policy's observation history).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from embodied.action_chunks import ChunkSpec
from embodied.data.lerobot_format import ACTION_KEY, IMAGE_PREFIX, STATE_KEY, task_map
from embodied.errors import EmbodiedError, import_optional
from embodied.lerobot_source import is_lerobot_source, lerobot_reference
from embodied.policies.vla import LeRobotPolicy

SETUP_HINT = "bash scripts/setup_lerobot.sh, then run embodied from .venv-lerobot"
PREPROCESSOR_FILE = "policy_preprocessor.json"


class LeRobotFeatureError(EmbodiedError):
    """The env's observations do not match a LeRobot policy's declared features."""


def provided_features(
    obs_spec: Mapping[str, tuple[int, ...]], state_group: str, cameras: Mapping[str, str]
) -> dict[str, tuple[int, ...]]:
    """LeRobot feature name -> shape of what the env provides (images channels-first, as LeRobot declares them)."""
    if state_group not in obs_spec:
        raise LeRobotFeatureError(
            f"the task's LeRobot mapping sends group {state_group!r} as {STATE_KEY}, but the env's groups are {sorted(obs_spec)}"
        )
    out: dict[str, tuple[int, ...]] = {STATE_KEY: (int(math.prod(obs_spec[state_group])),)}
    for name, group in cameras.items():
        if group not in obs_spec:
            raise LeRobotFeatureError(
                f"camera {name!r} reads observation group {group!r}, which the env does not produce "
                f"(groups: {sorted(obs_spec)}); run the task with its camera (env.backend.camera=NAME)"
            )
        h, w, c = obs_spec[group]
        out[IMAGE_PREFIX + name] = (c, h, w)
    return out


def check_features(
    declared: Mapping[str, tuple[int, ...]],
    provided: Mapping[str, tuple[int, ...]],
    declared_action: tuple[int, ...],
    action_dim: int,
    where: str,
) -> None:
    """Raise :class:`LeRobotFeatureError` unless the declared input features equal the provided
    ones, name for name and shape for shape, and the action sizes agree."""
    problems = []
    for name in sorted(set(declared) | set(provided)):
        want, have = declared.get(name), provided.get(name)
        if have is None:
            problems.append(f"missing {name}: the policy reads shape {want}, the env provides nothing by that name")
        elif want is None:
            problems.append(f"extra {name}: the env provides shape {have}, the policy declares no such input")
        elif tuple(want) != tuple(have):
            problems.append(f"{name}: the policy reads shape {tuple(want)}, the env provides {tuple(have)}")
    if tuple(declared_action) != (action_dim,):
        problems.append(
            f"{ACTION_KEY}: the policy outputs shape {tuple(declared_action)}, the task acts with ({action_dim},)"
        )
    if problems:
        raise LeRobotFeatureError(
            f"{where}: the policy's features do not fit this task ({'; '.join(problems)}); the mapping is the task's row "
            "in embodied/data/lerobot_format.py (LEROBOT_TASKS)"
        )


def _declared(config: Any) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """Declared input features (name -> shape) and the action shape of a LeRobot policy config."""
    inputs = {name: tuple(int(v) for v in feature.shape) for name, feature in config.input_features.items()}
    action = config.output_features.get(ACTION_KEY)
    return inputs, (() if action is None else tuple(int(v) for v in action.shape))


def chunk_spec_of(config: Any) -> ChunkSpec:
    """The checkpoint's chunk settings: ``chunk_size`` (``horizon`` for diffusion) and ``n_action_steps``."""
    exec_steps = int(getattr(config, "n_action_steps", 1))
    horizon = int(getattr(config, "chunk_size", getattr(config, "horizon", exec_steps)))
    return ChunkSpec(horizon, exec_steps)


def lerobot_config(source: str | Path) -> tuple[str, Any]:
    """``(ref, config)``: the hub id or folder of ``lerobot:<ref>`` and its ``PreTrainedConfig``,
    read by LeRobot's own ``PreTrainedConfig.from_pretrained`` (errors name the source)."""
    ref = lerobot_reference(source)
    configs = import_optional("lerobot.configs.policies", f"loading {source}", SETUP_HINT)
    # the factory imports every built-in policy's config class, which registers its `type` with
    # PreTrainedConfig; installed `lerobot_policy_*` plugins register
    # when imported, as LeRobot's scripts import them (embodied's exports: types 'embodied' and
    # 'embodied_residual')
    import_optional("lerobot.policies.factory", f"loading {source}", SETUP_HINT)
    import_optional("lerobot.utils.import_utils", f"loading {source}", SETUP_HINT).register_third_party_plugins()
    unknown_type = import_optional("draccus.utils", f"loading {source}", SETUP_HINT).DecodingError
    if Path(ref).exists() and not (Path(ref) / PREPROCESSOR_FILE).is_file():
        raise EmbodiedError(
            f"{ref}: no {PREPROCESSOR_FILE}; a checkpoint saved before LeRobot 0.4 keeps its normalization inside "
            "the model: convert it with LeRobot's lerobot/processor/migrate_policy_normalization.py first"
        )
    try:
        config = configs.PreTrainedConfig.from_pretrained(ref)
    except (OSError, ValueError) as err:  # not found locally or on the Hub (offline), or no config.json
        raise EmbodiedError(f"--base {source}: LeRobot cannot load a policy config from {ref!r} ({err})") from None
    except unknown_type as err:  # a `type` no installed LeRobot policy or plugin registers
        raise EmbodiedError(
            f"{source}: LeRobot knows no policy type of {ref!r}/config.json ({' '.join(str(err).split())[:200]}); "
            "install the LeRobot policy plugin that defines it"
        ) from None
    return ref, config


def load_lerobot_policy(
    source: str | Path,
    task: str,
    obs_spec: Mapping[str, tuple[int, ...]],
    action_dim: int,
    rendered_camera: str | None,
    device: torch.device | str = "cpu",
) -> LeRobotPolicy:
    """Load ``lerobot:<ref>`` with LeRobot's own code and wrap it for task ``task`` (see module docstring)."""
    ref, config = lerobot_config(source)
    factory = import_optional("lerobot.policies.factory", f"loading {source}", SETUP_HINT)
    config.device = str(device)
    mapping = task_map(task)
    cameras = mapping.camera_groups(rendered_camera, obs_spec)
    declared, action_shape = _declared(config)
    check_features(
        declared,
        provided_features(obs_spec, mapping.state_group, cameras),
        action_shape,
        action_dim,
        f"lerobot:{ref} ({config.type}) on {task}",
    )
    policy = factory.get_policy_class(config.type).from_pretrained(ref, config=config).eval()
    preprocessor, postprocessor = factory.make_pre_post_processors(
        config, pretrained_path=ref, preprocessor_overrides={"device_processor": {"device": str(device)}}
    )
    return LeRobotPolicy(
        policy,
        mapping.instruction,
        cameras,
        chunk_spec_of(config),
        preprocessor=preprocessor,
        postprocessor=postprocessor,
        lerobot_queue=True,
        state_group=mapping.state_group,
    )


def rendered_camera(env_cfg: object) -> str | None:
    """The camera a task's config renders into the ``image`` group (``env.backend.camera``), or None."""
    camera = getattr(getattr(env_cfg, "backend", None), "camera", None)
    return str(camera) if camera else None


def load_base_policy(base: str | Path, task: str, env_cfg: object, env: Any, device: torch.device | str) -> Any:
    """``--base``'s policy: ``lerobot:<ref>`` through :func:`load_lerobot_policy`, else a run directory's."""
    if is_lerobot_source(base):
        return load_lerobot_policy(base, task, env.obs_spec, env.action_dim, rendered_camera(env_cfg), device)
    from embodied.training.run import load_run

    return load_run(Path(base), device=device).policy
