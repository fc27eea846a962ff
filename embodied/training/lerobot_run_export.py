"""``embodied export RUN --format lerobot`` for a run that fine-tuned a LeRobot policy in place
(``--algo reinflow --base lerobot:PATH``: a SmolVLA whose action expert ReinFlow trained).

The run's policy *is* LeRobot's module (its weights changed, its class did not), so the export is
LeRobot's own ``save_pretrained`` of that module and of the checkpoint's processor pipelines into
``RUN_DIR/export/lerobot/``: what ``from_pretrained`` and LeRobot's evaluation and recording
tools load, with no plugin. Parity: the folder is loaded back through ``--base lerobot:`` loading
(LeRobot's ``from_pretrained`` and processors) and its chunks are compared with the run's policy
on observations of a short rollout of the run's task, both sampling from the same seed (a flow
policy's sampler draws its start noise), to :data:`embodied.export.onnx.PARITY_TOL`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from embodied.errors import EmbodiedError
from embodied.export.bundle import ExportReport, export_dir
from embodied.export.formats import ALL, FormatResult
from embodied.export.onnx import PARITY_TOL
from embodied.policies.vla import LeRobotPolicy
from embodied.training.lerobot_base import load_lerobot_policy, rendered_camera
from embodied.training.run import LoadedRun

LEROBOT_FORMAT = "lerobot"
PARITY_STEPS = 4
"""Rollout steps whose observations (every env's) the parity check compares."""


def export_lerobot_run(run: LoadedRun, fmt: str) -> ExportReport | None:
    """Save a fine-tuned LeRobot policy as a LeRobot checkpoint; None when the run's policy is not one."""
    policy = run.policy
    if not isinstance(policy, LeRobotPolicy) or policy.lerobot is None:
        return None
    if fmt not in (ALL, LEROBOT_FORMAT):
        raise EmbodiedError(
            f"format {fmt!r} cannot hold a fine-tuned LeRobot policy (its backbone and expert are LeRobot's "
            "module); export it with --format lerobot"
        )
    out = export_dir(run.run_dir) / LEROBOT_FORMAT
    out.mkdir(parents=True, exist_ok=True)
    module: Any = policy.lerobot  # LeRobot's PreTrainedPolicy (typed as the nn.Module it is)
    module.save_pretrained(out)
    for processor in (policy.preprocessor, policy.postprocessor):
        save = getattr(processor, "save_pretrained", None)
        if callable(save):
            save(out)
    return lerobot_folder_report(out, _parity(run, policy, out))


def lerobot_folder_report(out: Path, max_abs_err: float) -> ExportReport:
    """The export report of a LeRobot checkpoint folder: every file under ``out`` (a residual's
    ``base/`` included), hashed by its ``*.safetensors`` weights, with the parity error."""
    written = sorted(p for p in out.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for path in sorted(out.rglob("*.safetensors")):
        digest.update(path.read_bytes())
    report = ExportReport(model_sha256=digest.hexdigest())
    report.written += written
    report.formats[LEROBOT_FORMAT] = FormatResult(written, max_abs_err=max_abs_err)
    return report


def _parity(run: LoadedRun, policy: LeRobotPolicy, folder: Path) -> float:
    """Max ``|loaded - run|`` of the chunks on a short rollout's observations (same sampling seed)."""
    env = run.make_env(2, seed=0)
    try:
        loaded = load_lerobot_policy(
            f"lerobot:{folder}", run.cfg.task_name, env.obs_spec, env.action_dim, rendered_camera(run.cfg.env)
        )
        obs = env.reset(seed=0)
        err = 0.0
        for _ in range(PARITY_STEPS):
            torch.manual_seed(0)
            want = policy.plan(obs)
            torch.manual_seed(0)
            got = loaded.plan(obs)
            err = max(err, float((got - want).abs().max()))
            obs = env.step(want[:, 0].to(env.device))[0]
    finally:
        env.close()
    if not err <= PARITY_TOL:
        raise EmbodiedError(
            f"{folder}: the saved LeRobot checkpoint differs from the run's policy by {err:.3g} (> {PARITY_TOL:g})"
        )
    return err
