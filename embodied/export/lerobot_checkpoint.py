"""``embodied export RUN --format lerobot``: the run's policy as a LeRobot checkpoint.

``RUN_DIR/export/lerobot/`` is what LeRobot's ``save_pretrained`` writes for policy type
``embodied`` (the plugin in ``integrations/lerobot_policy_embodied``, installed into the LeRobot
environment by ``scripts/setup_lerobot.sh``): ``config.json`` (``observation.state [D]`` ->
``action [A]``, ``chunk_size`` = the chunk, ``n_action_steps`` = ``exec_steps``), the policy
artifact ``embodied_policy.pt`` and the processor pipelines ``policy_preprocessor.json`` /
``policy_postprocessor.json``. LeRobot's own ``from_pretrained`` + ``make_pre_post_processors``
load it, and its scripts (``lerobot-eval``, ``lerobot-record``) run it, since they import
installed ``lerobot_policy_*`` plugins. Kinds reading the policy vector alone (``mlp``,
``flow``) are exported; a temporal-ensemble policy is refused (LeRobot's queue executes plans
receding-horizon). Parity: LeRobot's loaded policy, ``select_action`` step by step, against
embodied's own execution of the artifact on the same observations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.env import ObsDict
from embodied.errors import EmbodiedError, import_optional
from embodied.export.artifact import PolicyArtifact

LEROBOT_SUBDIR = "lerobot"
PLUGIN = "lerobot_policy_embodied"
SETUP_HINT = "bash scripts/setup_lerobot.sh (installs lerobot and the plugin), then run embodied from .venv-lerobot"
STATE_KEY = "observation.state"
ACTION_KEY = "action"


def _plugin() -> Any:
    import_optional("lerobot", "export --format lerobot", SETUP_HINT)
    return import_optional(PLUGIN, "export --format lerobot (LeRobot policy type 'embodied')", SETUP_HINT)


def load_lerobot_checkpoint(folder: Path, device: str = "cpu") -> tuple[Any, Any, Any]:
    """``(policy, preprocessor, postprocessor)`` of a LeRobot checkpoint, by LeRobot's own loaders."""
    _plugin()
    factory = import_optional("lerobot.policies.factory", "loading a LeRobot checkpoint", SETUP_HINT)
    configs = import_optional("lerobot.configs.policies", "loading a LeRobot checkpoint", SETUP_HINT)
    config = configs.PreTrainedConfig.from_pretrained(folder)
    config.device = device
    policy = factory.get_policy_class(config.type).from_pretrained(folder, config=config)
    pre, post = factory.make_pre_post_processors(
        config, pretrained_path=str(folder), preprocessor_overrides={"device_processor": {"device": device}}
    )
    return policy, pre, post


def write_lerobot_checkpoint(artifact: PolicyArtifact, folder: Path) -> list[Path]:
    """Write ``artifact`` as a LeRobot checkpoint of type ``embodied`` into ``folder``."""
    plugin = _plugin()
    types = import_optional("lerobot.configs.types", "export --format lerobot", SETUP_HINT)
    if artifact.obs_groups != ("policy",):
        raise EmbodiedError(
            f"format 'lerobot' holds policies of the policy vector alone (kinds mlp, flow); this one ({artifact.kind}) "
            f"reads {', '.join(artifact.obs_groups)}"
        )
    chunk = artifact.chunk_spec
    if chunk.temporal_ensemble:
        raise EmbodiedError(
            "format 'lerobot' executes plans receding-horizon (LeRobot's action queue); this policy averages "
            "overlapping plans (temporal_ensemble): export it with --format onnx"
        )
    spec = artifact.io_spec
    config = plugin.EmbodiedConfig(
        input_features={STATE_KEY: types.PolicyFeature(types.FeatureType.STATE, (spec.obs_dim,))},
        output_features={ACTION_KEY: types.PolicyFeature(types.FeatureType.ACTION, (spec.action_dim,))},
        chunk_size=chunk.length,
        n_action_steps=chunk.exec_steps,
        device="cpu",
    )
    policy = plugin.EmbodiedPolicy(config, artifact)
    pre, post = plugin.make_embodied_pre_post_processors(config)
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    return sorted(p for p in Path(folder).iterdir() if p.is_file())


def lerobot_parity(folder: Path, artifact: PolicyArtifact, observations: np.ndarray) -> float:
    """Max ``|LeRobot - embodied|`` over ``observations [N, D]`` fed one step at a time (so the
    action queue and embodied's chunk runner both execute their plans)."""
    policy, pre, post = load_lerobot_checkpoint(folder)
    ours = artifact.policy()
    err = 0.0
    with torch.no_grad():
        for row in np.asarray(observations, dtype=np.float32):
            obs = torch.from_numpy(row[None])
            theirs = post(policy.select_action(pre({STATE_KEY: obs})))
            err = max(err, float((theirs - ours(obs)).abs().max()))
    return err


class LeRobotExporter:
    name: str = "lerobot"
    description: str = (
        "lerobot/ (a LeRobot checkpoint, policy type 'embodied': config.json, embodied_policy.pt, processors), "
        "loaded back by LeRobot's from_pretrained and checked step by step; a residual on a LeRobot base: type "
        "'embodied_residual', the base's checkpoint in lerobot/base/; needs the LeRobot environment"
    )
    files: tuple[str, ...] = (f"{LEROBOT_SUBDIR}/config.json",)
    vehicle: str | None = None
    kinds: tuple[str, ...] = ("mlp", "flow")
    in_all: bool = False
    """Not part of ``--format all``: it needs the LeRobot environment."""

    def export(self, artifact: PolicyArtifact, out_dir: Path, observations: np.ndarray) -> Any:
        from embodied.export.formats import FormatResult

        folder = Path(out_dir) / LEROBOT_SUBDIR
        written = write_lerobot_checkpoint(artifact, folder)
        return FormatResult(written, lerobot_parity(folder, artifact, observations))

    def load_policy(self, run_dir: Path, env: Any) -> Any:
        """The exported checkpoint as LeRobot runs it (``select_action`` through its processors)."""
        from embodied.export.formats import EXPORT_SUBDIR

        folder = Path(run_dir) / EXPORT_SUBDIR / LEROBOT_SUBDIR
        if not (folder / "config.json").is_file():
            raise EmbodiedError(f"{folder}: no LeRobot checkpoint; run `embodied export {run_dir} --format lerobot`")
        policy, pre, post = load_lerobot_checkpoint(folder, str(env.device))

        @torch.no_grad()
        def act(obs: ObsDict) -> torch.Tensor:
            action: torch.Tensor = post(policy.select_action(pre({STATE_KEY: obs["policy"].float()})))
            return action.to(env.device)

        return act
