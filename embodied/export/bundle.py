"""Export a policy artifact: ``RUN_DIR/export/`` with policy_io.json and the formats of
:data:`embodied.export.formats.EXPORTERS`.

Layout written here (and read by ``firmware``, ``flash``, ``eval --policy onnx|c``, ``deploy``)::

    RUN_DIR/export/policy_io.json    interface + model hash (always)
    RUN_DIR/export/policy.onnx       --format onnx|all
    RUN_DIR/export/c/policy.{h,c}    --format c|all
    RUN_DIR/export/host/             host builds of the C, parity-checked
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.artifact import PolicyArtifact
from embodied.export.formats import (
    ALL,
    C_SUBDIR,
    EXPORT_SUBDIR,
    HOST_SUBDIR,
    FormatResult,
    selected,
    unsupported_kind_reason,
)
from embodied.export.image_onnx import image_model_sha256, image_shape_of
from embodied.export.onnx import probe_observations, symmetry_twin
from embodied.export.policy_io import weights_sha256, write_policy_io
from embodied.io_spec import IOSpec

log = logging.getLogger(__name__)

RECORD_ENVS = 16
RECORD_STEPS = 100


def export_dir(run_dir: Path) -> Path:
    return Path(run_dir) / EXPORT_SUBDIR


def c_dir(run_dir: Path) -> Path:
    return export_dir(run_dir) / C_SUBDIR


def host_dir(run_dir: Path) -> Path:
    return export_dir(run_dir) / HOST_SUBDIR


@dataclass
class ExportReport:
    """Files written and, per format, its result (max |error| against torch and details)."""

    written: list[Path] = field(default_factory=list)
    formats: dict[str, FormatResult] = field(default_factory=dict)
    num_macs: int = 0
    model_sha256: str = ""

    def max_abs_err(self, fmt: str) -> float | None:
        result = self.formats.get(fmt)
        return None if result is None else result.max_abs_err

    @property
    def onnx_max_abs_err(self) -> float | None:
        return self.max_abs_err("onnx")

    @property
    def c_max_abs_err(self) -> float | None:
        return self.max_abs_err("c")

    @property
    def c_fast_tanh(self) -> bool | None:
        result = self.formats.get("c")
        return None if result is None else result.details.get("fast_tanh")


def export_model_sha256(module: nn.Module) -> str:
    """The ``model_sha256`` an export of ``module`` (an artifact's module) records: the hash of
    its traced graph for an image policy (:func:`~embodied.export.image_onnx.image_model_sha256`),
    else :func:`~embodied.export.policy_io.weights_sha256` (the graph built from its arrays)."""
    if image_shape_of(module) is not None:
        return image_model_sha256(module)
    return weights_sha256(module)


@torch.inference_mode()
def record_observations(
    policy: Callable[[torch.Tensor], torch.Tensor],
    make_env: Callable[[int, int], Any],
    num_envs: int = RECORD_ENVS,
    steps: int = RECORD_STEPS,
) -> np.ndarray:
    """``[num_envs * steps, obs_dim]`` policy observations visited by ``policy`` (``obs [N, D] ->
    action [N, A]``: an exported MLP module, or :meth:`PolicyArtifact.policy` for any kind)."""
    env = make_env(num_envs, 0)
    try:
        obs = env.reset(seed=0)
        rows = []
        for _ in range(steps):
            x = obs["policy"].detach().to("cpu", torch.float32)
            rows.append(x.numpy())
            obs, *_ = env.step(policy(x).to(env.device))
    finally:
        env.close()
    return np.concatenate(rows)


def export_artifact(
    artifact: PolicyArtifact,
    out_dir: Path,
    fmt: str,
    recorded_obs: np.ndarray | None = None,
    source_run: str = "",
) -> ExportReport:
    """Export ``artifact`` into ``out_dir``: ``policy_io.json`` always, then each format ``fmt``
    names (a :data:`~embodied.export.formats.EXPORTERS` key or ``all``)."""
    exporters = selected(fmt)  # an unknown format fails before anything is written
    if len(artifact.obs_groups) > 1:
        raise EmbodiedError(
            f"a policy of kind {artifact.kind!r} reads {', '.join(artifact.obs_groups)}: its export traces every input "
            "(embodied.training.run_policy.export_image_artifact; `embodied export RUN_DIR` does it)"
        )
    if fmt == ALL:
        skipped = [e.name for e in exporters if artifact.kind not in e.kinds]
        if skipped:
            log.info("a %s policy has no %s export; writing %s", artifact.kind, ", ".join(skipped), fmt)
        exporters = [e for e in exporters if artifact.kind in e.kinds]
    for exporter in exporters:
        if artifact.kind not in exporter.kinds:
            raise EmbodiedError(unsupported_kind_reason(exporter.name, artifact))
    vehicle = artifact.io_spec.extra.get("vehicle", "")
    for exporter in exporters:
        if exporter.vehicle is not None and exporter.vehicle != vehicle:
            raise EmbodiedError(
                f"format {exporter.name!r} needs a {exporter.vehicle!r} policy (policy_io extra.vehicle), "
                f"this one is {vehicle or 'for no vehicle'!r}"
            )
    module = artifact.module()
    out_dir = Path(out_dir)
    report = ExportReport(model_sha256=export_model_sha256(module), num_macs=artifact.description.num_macs)
    report.written.append(write_policy_io(out_dir, artifact.io_spec, report.model_sha256, source_run))
    checks = [probe_observations(artifact.description)]
    if recorded_obs is not None and len(recorded_obs):
        checks.append(np.asarray(recorded_obs, dtype=np.float32).reshape(-1, artifact.io_spec.obs_dim))
        if getattr(artifact.description, "symmetry", None) is not None:
            # A task's observations are canonical (one branch of the flip): check their mirror images too.
            checks.append(symmetry_twin(artifact.description, checks[-1]))
    observations = np.concatenate(checks)
    for exporter in exporters:
        result = exporter.export(artifact, out_dir, observations)
        report.formats[exporter.name] = result
        report.written += result.written
    return report


def export_module(
    module: nn.Module,
    io_spec: IOSpec,
    out_dir: Path,
    fmt: str,
    recorded_obs: np.ndarray | None = None,
    source_run: str = "",
) -> ExportReport:
    """Export an exported module (``Policy.export_module()``) with its ``io_spec``."""
    return export_artifact(PolicyArtifact.from_module(module, io_spec), out_dir, fmt, recorded_obs, source_run)
