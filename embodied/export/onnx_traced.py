"""ONNX export of non-MLP policies (flow samplers, ...) by tracing ``export_module()``.

The exporters of the policy artifact build their graphs from validated arrays (MLPs:
:mod:`embodied.export.onnx`; flow samplers: :mod:`embodied.export.flow_onnx`, so the hash is a
function of the weights alone). A module no artifact kind describes can still be traced here
with torch's TorchScript exporter, which needs no extra package. The graph still has one input ``obs``
``[batch, obs_dim]`` and one output ``action`` ``[batch, action_dim]``; its hash is the same
:func:`embodied.policy_io.graph_sha256` deployments recompute, and onnxruntime must match
torch to :data:`embodied.export.onnx.PARITY_TOL`.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from embodied.export.onnx import OPSET, OnnxExport, check_parity
from embodied.export.policy_io import ONNX_FILENAME
from embodied.policy_io import graph_sha256

log = logging.getLogger(__name__)


def export_traced_onnx(module: nn.Module, obs_dim: int, export_dir: Path, probes: np.ndarray) -> OnnxExport:
    """Trace ``module`` (``obs [B, obs_dim] -> action [B, A]``) to ``export_dir/policy.onnx``;
    check onnxruntime against torch on ``probes`` ``[N, obs_dim]``."""
    path = trace_to_onnx(module, {"obs": torch.zeros(2, obs_dim)}, export_dir)
    sha = seal_onnx(path)
    err = check_parity(module, path, probes)
    log.info("wrote %s (max |onnx - torch| = %.2e over %d observations)", path, err, len(probes))
    return OnnxExport(path, sha, err, len(probes))


def trace_to_onnx(module: nn.Module, examples: dict[str, torch.Tensor], export_dir: Path) -> Path:
    """Trace ``module(*examples.values())`` to ``export_dir/policy.onnx`` with inputs named as
    ``examples``' keys (batch dimension dynamic) and one output ``action``; checked by onnx."""
    import onnx

    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    path = export_dir / ONNX_FILENAME
    tmp = path.with_suffix(".onnx.tmp")
    names = list(examples)
    with warnings.catch_warnings():
        # the TorchScript exporter is deprecated in favour of one that needs onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module.eval(),
            tuple(examples.values()),
            str(tmp),
            input_names=names,
            output_names=["action"],
            dynamic_axes={**{name: {0: "batch"} for name in names}, "action": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    onnx.checker.check_model(onnx.load(str(tmp)))
    tmp.replace(path)
    return path


def seal_onnx(path: Path) -> str:
    """Write the graph's hash into ``path``'s ``model_sha256`` property (what deployments recompute)."""
    import onnx

    model = onnx.load(str(path))
    sha = graph_sha256(model.graph)
    onnx.helper.set_model_props(model, {"model_sha256": sha})
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return sha
