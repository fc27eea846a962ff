"""``policy_io.json`` writer and the exported weights' hash (needs torch).

Reading and validating the file is :mod:`embodied.policy_io` (torch-free, shared with the robot
runtime); its names are re-exported here for the exporters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.policy_io import (
    FORMAT_VERSIONS,
    ONNX_FILENAME,
    POLICY_IO_FILENAME,
    POLICY_IO_VERSION,
    PolicyIO,
    check_model_hash,
    graph_sha256,
    read_policy_io,
)

__all__ = [
    "FORMAT_VERSIONS",
    "ONNX_FILENAME",
    "POLICY_IO_FILENAME",
    "POLICY_IO_VERSION",
    "PolicyIO",
    "check_hash",
    "check_model_hash",
    "read_policy_io",
    "weights_sha256",
    "write_policy_io",
]


def weights_sha256(module: nn.Module) -> str:
    """Hex SHA-256 of the ONNX graph an exported module becomes: every initializer (the weights,
    biases, normalizer and clip constants) and every node (operator, wiring, attributes).

    It is :func:`graph_sha256` of the graph :mod:`embodied.export.onnx` builds for ``module``,
    so a deployment recomputes it from ``policy.onnx`` alone (:func:`onnx_file_sha256`, no
    torch) and a zeroed or altered weight matrix no longer matches ``policy_io.json``. Metadata
    (which holds the hash itself) is not hashed. Two modules with the same weights hash equally
    on every machine.
    """
    from embodied.export.onnx import onnx_model

    return graph_sha256(onnx_model(module)[1].graph)


def write_policy_io(
    export_dir: Path,
    io_spec: IOSpec,
    model_sha256: str,
    source_run: str | Path = "",
    **extra_top_level: Any,
) -> Path:
    """Write ``export_dir/policy_io.json`` and return its path."""
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    path = export_dir / POLICY_IO_FILENAME
    io_spec.save(
        path,
        model_sha256=model_sha256,
        format_versions=dict(FORMAT_VERSIONS),
        source_run=str(source_run),
        **extra_top_level,
    )
    return path


def check_hash(policy_io: PolicyIO, module: nn.Module) -> None:
    """Raise when ``module``'s weights are not the ones ``policy_io`` was written for."""
    actual = weights_sha256(module)
    if actual != policy_io.model_sha256:
        raise EmbodiedError(
            f"{policy_io.path}: model_sha256 {policy_io.model_sha256[:12]}... does not match the "
            f"weights being exported ({actual[:12]}...); re-export the run"
        )
