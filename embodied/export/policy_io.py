"""``policy_io.json`` writer and the exported weights' hash (needs torch).

Reading and validating the file is :mod:`embodied.policy_io` (torch-free, shared with the robot
runtime); its names are re-exported here for the exporters.
"""

from __future__ import annotations

import hashlib
import struct
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
    """Hex SHA-256 of an exported module's tensors (parameters and buffers) and float attributes.

    Canonical and independent of pickling: for each ``state_dict`` entry in sorted key order
    the name, the shape and the float32 little-endian bytes are hashed, then ``obs_clip`` if
    the module has one. Two modules with the same weights hash equally on every machine.
    """
    digest = hashlib.sha256()
    state = module.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().float().cpu().contiguous()
        digest.update(name.encode())
        digest.update(struct.pack(f"<{tensor.dim()}q", *tensor.shape))
        digest.update(tensor.numpy().astype("<f4").tobytes())
    clip = getattr(module, "obs_clip", None)
    if clip is not None:
        digest.update(struct.pack("<d", float(clip)))
    return digest.hexdigest()


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
