"""ONNX export of non-MLP policies (flow samplers, ...) by tracing ``export_module()``.

The exporters of the policy artifact build their graphs from validated arrays (MLPs:
:mod:`embodied.export.onnx`; flow samplers: :mod:`embodied.export.flow_onnx`, so the hash is a
function of the weights alone). A module no artifact kind describes can still be traced here
with torch's TorchScript exporter, which needs no extra package. The graph has one input ``obs``
``[batch, obs_dim]`` (an image policy also ``image`` ``[batch, H, W, 3]`` uint8,
:func:`export_traced_inputs`) and one output ``action`` ``[batch, action_dim]``; its hash is the same
:func:`embodied.policy_io.graph_sha256` deployments recompute, and onnxruntime must match
torch to :data:`embodied.export.onnx.PARITY_TOL`.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.export.onnx import OPSET, OnnxExport, check_parity_inputs
from embodied.export.policy_io import ONNX_FILENAME
from embodied.policy_io import graph_sha256

log = logging.getLogger(__name__)


def export_traced_onnx(module: nn.Module, obs_dim: int, export_dir: Path, probes: np.ndarray) -> OnnxExport:
    """Trace ``module`` (``obs [B, obs_dim] -> action [B, A]``) to ``export_dir/policy.onnx``;
    check onnxruntime against torch on ``probes`` ``[N, obs_dim]``."""
    return export_traced_inputs(
        module, {"obs": torch.zeros(2, obs_dim)}, export_dir, {"obs": np.asarray(probes, dtype=np.float32)}
    )


def traced_model(module: nn.Module, examples: Mapping[str, torch.Tensor]) -> Any:
    """The checked ONNX ``ModelProto`` (no metadata) of ``module`` traced with one graph input per
    entry of ``examples`` (name -> example tensor ``[2, ...]`` of the input's dtype, in
    ``forward``'s argument order; batch dynamic) and the output ``action``. Tracing the same
    module twice gives the same graph, so :func:`graph_sha256` of it identifies the weights."""
    import onnx

    names = list(examples)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # the TorchScript exporter is deprecated in favour of one that needs onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        path = Path(tmp) / ONNX_FILENAME
        torch.onnx.export(
            module.eval(),
            tuple(examples.values()),
            str(path),
            input_names=names,
            output_names=["action"],
            dynamic_axes={**{name: {0: "batch"} for name in names}, "action": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
        model = onnx.load(str(path))
    onnx.checker.check_model(model)
    return model


def export_traced_inputs(
    module: nn.Module,
    examples: Mapping[str, torch.Tensor],
    export_dir: Path,
    probes: Mapping[str, np.ndarray],
    filename: str = ONNX_FILENAME,
) -> OnnxExport:
    """Trace ``module`` (:func:`traced_model`) to ``export_dir/filename``, its
    :func:`graph_sha256` in the metadata; check onnxruntime against torch on ``probes`` (name ->
    ``[N, ...]``)."""
    import onnx

    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    path = export_dir / filename
    tmp = path.with_suffix(".onnx.tmp")
    model = traced_model(module, examples)
    sha = graph_sha256(model.graph)
    onnx.helper.set_model_props(model, {"model_sha256": sha})
    onnx.save(model, str(tmp))
    tmp.replace(path)
    err = check_parity_inputs(module, path, probes)
    count = len(next(iter(probes.values())))
    log.info("wrote %s (max |onnx - torch| = %.2e over %d inputs)", path, err, count)
    return OnnxExport(path, sha, err, count)
