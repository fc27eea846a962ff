"""``embodied export RUN --format lerobot`` for a residual run on a LeRobot base
(``--algo residual|o2o-residual --base lerobot:PATH``).

The run's policy is embodied's residual (``policies/residual.py``) on a frozen LeRobot policy
that acts through its own ``select_action`` queue. ``RUN_DIR/export/lerobot/`` becomes a LeRobot
checkpoint of policy type ``embodied_residual`` (the plugin ``integrations/lerobot_policy_embodied``,
installed by ``scripts/setup_lerobot.sh``):

- ``config.json``: the base's input and output features, the residual's sizes (``hidden``,
  ``activation``), ``residual_scale``, its observation normalization (``normalize_obs``,
  ``obs_clip``) and the base's action range (``base_action_low``/``high``);
- ``model.safetensors``: the residual's weights and observation statistics;
- ``policy_preprocessor.json``/``policy_postprocessor.json`` (+ state files): batching and device;
- ``base/``: the base saved by LeRobot's own ``save_pretrained`` (model and processor pipelines),
  which works for a Hub id as for a folder.

Its ``select_action`` runs the base's processors and ``select_action`` (chunks execute as in
training, whatever the base's ``n_action_steps`` or temporal ensembling) and adds the residual
with embodied's own code. Parity: the folder is loaded back through ``lerobot:`` loading
(:func:`~embodied.training.lerobot_base.load_lerobot_policy`, LeRobot's ``from_pretrained``)
and its actions are compared with the run's policy step by step over a short rollout of the
run's task, both sampling from the same seed each step, to :data:`embodied.export.onnx.PARITY_TOL`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from embodied.errors import EmbodiedError, import_optional
from embodied.export.bundle import ExportReport, export_dir
from embodied.export.formats import ALL
from embodied.export.lerobot_checkpoint import PLUGIN, SETUP_HINT
from embodied.export.onnx import PARITY_TOL
from embodied.policies.residual import ResidualPolicy
from embodied.policies.vla import LeRobotPolicy
from embodied.training.lerobot_base import load_lerobot_policy, rendered_camera
from embodied.training.lerobot_run_export import LEROBOT_FORMAT, lerobot_folder_report
from embodied.training.run import LoadedRun

log = logging.getLogger(__name__)

PARITY_ENVS = 2
PARITY_STEPS = 8
"""Rollout steps compared, one action at a time (several plans of a chunked base)."""


def export_lerobot_residual_run(run: LoadedRun, fmt: str) -> ExportReport | None:
    """Write the residual and its LeRobot base as one LeRobot checkpoint; None for any other run."""
    policy = run.policy
    if not isinstance(policy, ResidualPolicy) or not isinstance(policy.base, LeRobotPolicy):
        return None
    if fmt not in (ALL, LEROBOT_FORMAT):
        raise EmbodiedError(
            f"format {fmt!r} cannot hold a residual on a LeRobot base (the base is LeRobot's module, run by its own "
            "select_action); export it with --format lerobot (from the LeRobot environment: bash scripts/setup_lerobot.sh)"
        )
    if fmt == ALL:
        log.info("a residual on a LeRobot base exports as a LeRobot checkpoint only; writing lerobot")
    base = policy.base
    module = exportable_base(base, run.run_dir)
    plugin = import_optional(PLUGIN, "export --format lerobot (LeRobot policy type 'embodied_residual')", SETUP_HINT)
    config = plugin.EmbodiedResidualConfig(
        input_features=dict(module.config.input_features),
        output_features=dict(module.config.output_features),
        hidden=[int(h) for h in run.algo.cfg.actor_hidden],
        activation=str(run.algo.cfg.activation),
        residual_scale=policy.scale,
        normalize_obs=policy.obs_norm is not None,
        obs_clip=float(policy.obs_norm.clip) if policy.obs_norm is not None else float(run.algo.cfg.obs_clip),
        # the range is a scalar or per component: one value per action component in the config
        base_action_low=base.action_low.expand(run.io_spec.action_dim).tolist(),
        base_action_high=base.action_high.expand(run.io_spec.action_dim).tolist(),
        device="cpu",
    )
    exported = plugin.EmbodiedResidualPolicy(config, module, base.preprocessor, base.postprocessor)
    exported.residual.load_state_dict(policy.state_dict())
    out = export_dir(run.run_dir) / LEROBOT_FORMAT
    if out.exists():  # an earlier export (possibly of another policy type) must not leave files behind
        shutil.rmtree(out)
    exported.save_pretrained(out)
    for processor in plugin.make_embodied_residual_pre_post_processors(config):
        processor.save_pretrained(out)
    return lerobot_folder_report(out, _parity(run, policy, out))


def exportable_base(base: LeRobotPolicy, run_dir: Path) -> Any:
    """The base's LeRobot module, or a named error for a base the checkpoint cannot reproduce."""
    where = f"{run_dir}: the residual's LeRobot base"
    if base.lerobot is None or not hasattr(base.lerobot, "save_pretrained"):
        raise EmbodiedError(f"{where} is not a LeRobot PreTrainedPolicy, so LeRobot cannot save it")
    if not base.lerobot_queue:
        raise EmbodiedError(
            f"{where} ran its chunks through embodied's chunk runner, not its own select_action; the checkpoint "
            "runs select_action, so it would execute them differently (load the base with lerobot:PATH)"
        )
    if base.state_group != "policy":
        raise EmbodiedError(
            f"{where} reads observation group {base.state_group!r} as observation.state while the residual reads "
            "the 'policy' group, which the checkpoint has no input for; give the task's LEROBOT_TASKS row "
            "state_group='policy' (embodied/data/lerobot_format.py) and train again"
        )
    for processor in (base.preprocessor, base.postprocessor):
        if not callable(getattr(processor, "save_pretrained", None)):
            raise EmbodiedError(f"{where} has no LeRobot processor pipelines to save (load it with lerobot:PATH)")
    return base.lerobot


def _parity(run: LoadedRun, policy: ResidualPolicy, folder: Path) -> float:
    """Max ``|loaded - run|`` of the actions over a short rollout, one step at a time (both
    policies' base queues start empty; each step samples from the same seed on both sides)."""
    env = run.make_env(PARITY_ENVS, seed=0)
    base = policy.base
    assert isinstance(base, LeRobotPolicy)
    try:
        loaded = load_lerobot_policy(
            f"lerobot:{folder}", run.cfg.task_name, env.obs_spec, env.action_dim, rendered_camera(run.cfg.env)
        )
        base.reset_plan()
        loaded.reset_plan()
        obs = env.reset(seed=0)
        err = 0.0
        for step in range(PARITY_STEPS):
            torch.manual_seed(step)
            want = policy.act(obs)
            torch.manual_seed(step)
            got = loaded.act(obs, deterministic=True)
            err = max(err, float((got - want).abs().max()))
            obs = env.step(want.to(env.device))[0]
    finally:
        env.close()
        base.reset_plan()
    if not err <= PARITY_TOL:
        raise EmbodiedError(
            f"{folder}: the saved LeRobot checkpoint acts differently from the run's residual policy by {err:.3g} "
            f"(> {PARITY_TOL:g}) over a rollout; export is wrong"
        )
    return err
