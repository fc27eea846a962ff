"""``embodied export`` for a run whose policy is a residual on a frozen base (``residual``,
``o2o-residual``).

No policy artifact kind describes base and residual together, so the run's checkpoint is loaded
(its base from ``trainer.base_run``) and :meth:`ResidualPolicy.export_module`, one pure
``obs [B, D] -> action [B, A]`` graph, is traced to ``RUN_DIR/export/policy.onnx``
(:mod:`embodied.export.onnx_traced`), checked against torch with onnxruntime, and described by a
``policy_io.json`` as any vector policy is: ``embodied deploy`` runs it like any other export. A
base the graph cannot carry (an image-instruction base, chunks run open-loop or blended) is refused by
``export_module`` naming it; only ONNX holds the traced graph (``--format c`` is refused).

Parity probes: the policy observations of a short rollout of the run's own task, plus random
observations spread over the residual's normalizer statistics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from embodied.errors import EmbodiedError
from embodied.export.bundle import ExportReport, export_dir, record_observations
from embodied.export.formats import ALL, FormatResult
from embodied.export.onnx_traced import export_traced_onnx
from embodied.export.policy_io import write_policy_io
from embodied.policies.residual import ResidualPolicy
from embodied.training.run import LoadedRun

RANDOM_PROBES = 256


def export_residual_run(run: LoadedRun, fmt: str) -> ExportReport | None:
    """Export a residual run (see the module docstring); None when the run's policy is not one."""
    run_dir = run.run_dir
    if not isinstance(run.policy, ResidualPolicy):
        return None
    if fmt not in (ALL, "onnx"):
        raise EmbodiedError(
            f"format {fmt!r} cannot hold a residual policy (base and residual are traced into one graph); "
            "export it with --format onnx"
        )
    module = run.policy.export_module()  # names a base it cannot carry
    with torch.no_grad():
        recorded = record_observations(module, lambda n, seed: run.make_env(n, seed=seed))
        mean, std = module.obs_mean, module.obs_std
        gen = torch.Generator().manual_seed(0)
        spread = mean + 2.0 * std * torch.randn(RANDOM_PROBES, mean.shape[0], generator=gen)
    probes = np.concatenate([recorded, spread.numpy()]).astype(np.float32)
    out = export_dir(run_dir)
    onnx = export_traced_onnx(module, run.io_spec.obs_dim, out, probes)
    report = ExportReport(model_sha256=onnx.model_sha256)
    report.written.append(write_policy_io(out, run.io_spec, onnx.model_sha256, str(Path(run_dir).resolve())))
    report.written.append(onnx.path)
    report.formats["onnx"] = FormatResult([onnx.path], max_abs_err=onnx.max_abs_err)
    return report
