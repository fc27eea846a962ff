"""``policy_io.json`` reader: the interface file written next to every exported policy.

It holds :meth:`IOSpec.to_dict` plus what a deployment needs to trust the file: the hash of
the exported weights (``model_sha256``), format versions and the source run. The ROS 2
runtime, the C generator and the firmware build read it through :func:`read_policy_io`, which
validates it and names the key at fault.

This module imports no torch and no onnx: the robot-side runtime (``embodied.real``) depends on
it and must install into a ROS 2 Python with only numpy and a middleware. The writer and
the weight hash live in :mod:`embodied.export.policy_io`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.action_chunks import ChunkSpec
from embodied.errors import EmbodiedError
from embodied.io_spec import ActionField, IOSpec, ObsField

POLICY_IO_FILENAME = "policy_io.json"
POLICY_IO_VERSION = 1
"""Bumped whenever a reader would misinterpret an older file."""

FORMAT_VERSIONS: dict[str, int] = {"policy_io": POLICY_IO_VERSION, "onnx_opset": 17, "c_header": 1}

_REQUIRED_KEYS: tuple[str, ...] = (
    "obs_fields",
    "action_fields",
    "control_period_s",
    "obs_dim",
    "action_dim",
    "model_sha256",
    "format_versions",
)


ONNX_FILENAME = "policy.onnx"
"""The ONNX model's name inside an export folder, next to ``policy_io.json``."""

IMAGE_INPUT_KEY = "image_input"
"""Top-level ``policy_io.json`` key describing the image input of an image policy (written by
:mod:`embodied.export.image_onnx`); absent for a policy that reads the observation vector alone."""
INSTRUCTION_INPUT_KEY = "instruction_input"
"""Top-level ``policy_io.json`` key of an image-instruction flow policy's instruction embedding input."""
RESIDUAL_STEP_KEY = "residual_step"
"""Top-level ``policy_io.json`` key of a residual policy on a base with state between calls:
``policy.onnx`` is then the base's planner and this entry names the second graph
(:mod:`embodied.residual_graph`) applied to each executed base action."""


@dataclass(frozen=True)
class PolicyIO:
    """A validated ``policy_io.json``."""

    io_spec: IOSpec
    model_sha256: str
    format_versions: dict[str, int]
    source_run: str
    path: Path
    image_input: dict[str, Any] | None = None
    """``image_input``: what an image policy reads besides ``obs`` (None: the vector alone)."""
    instruction_input: dict[str, Any] | None = None
    """``instruction_input``: the instruction embedding an image-instruction flow policy reads (None: none)."""
    residual_step: dict[str, Any] | None = None
    """``residual_step``: the residual graph run on each executed base action (None: none)."""

    @property
    def action_history(self) -> int:
        """``extra.action_history`` (0 when the task keeps no action history)."""
        return int(self.io_spec.extra.get("action_history", 0))

    @property
    def chunk(self) -> ChunkSpec:
        """``extra.action_chunk``: actions per plan and how many run before re-planning (1, 1
        for a policy that returns one action)."""
        return ChunkSpec.from_extra(self.io_spec.extra, f"{self.path}: extra")


def _fail(path: Path, message: str) -> EmbodiedError:
    return EmbodiedError(f"{path}: {message}")


def _validate(path: Path, data: Any) -> PolicyIO:
    if not isinstance(data, dict):
        raise _fail(path, f"expected a JSON object at the top level, got {type(data).__name__}")
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise _fail(path, f"missing key(s) {', '.join(missing)}; re-export with `embodied export RUN_DIR`")
    version = data["format_versions"].get("policy_io") if isinstance(data["format_versions"], dict) else None
    if version != POLICY_IO_VERSION:
        raise _fail(path, f"format_versions.policy_io is {version!r}; this reader understands {POLICY_IO_VERSION}")
    try:
        spec = IOSpec.from_dict(data)
    except (TypeError, KeyError, ValueError) as err:
        raise _fail(path, f"malformed obs_fields/action_fields: {err}") from None
    groups: tuple[tuple[str, Sequence[ObsField | ActionField]], ...] = (
        ("obs_fields", spec.obs_fields),
        ("action_fields", spec.action_fields),
    )
    for kind, fields in groups:
        if not fields:
            raise _fail(path, f"{kind} is empty")
        for i, f in enumerate(fields):
            if not isinstance(f.size, int) or f.size <= 0:
                raise _fail(path, f"{kind}[{i}] ({f.name!r}): size must be a positive integer, got {f.size!r}")
            if not math.isfinite(f.scale):
                raise _fail(path, f"{kind}[{i}] ({f.name!r}): scale must be finite, got {f.scale!r}")
    if spec.obs_dim != data["obs_dim"]:
        raise _fail(path, f"obs_dim is {data['obs_dim']} but the obs_fields sum to {spec.obs_dim}")
    if spec.action_dim != data["action_dim"]:
        raise _fail(path, f"action_dim is {data['action_dim']} but the action_fields sum to {spec.action_dim}")
    if not (math.isfinite(spec.control_period_s) and spec.control_period_s > 0):
        raise _fail(path, f"control_period_s must be a positive number of seconds, got {spec.control_period_s!r}")
    ChunkSpec.from_extra(spec.extra, f"{path}: extra")  # a malformed chunk is named here, not mid-flight
    sha = data["model_sha256"]
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise _fail(path, f"model_sha256 must be 64 lowercase hex digits, got {sha!r}")
    return PolicyIO(
        io_spec=spec,
        model_sha256=sha,
        format_versions={str(k): int(v) for k, v in data["format_versions"].items()},
        source_run=str(data.get("source_run", "")),
        path=path,
        image_input=image_input if isinstance(image_input := data.get(IMAGE_INPUT_KEY), dict) else None,
        instruction_input=text if isinstance(text := data.get(INSTRUCTION_INPUT_KEY), dict) else None,
        residual_step=step if isinstance(step := data.get(RESIDUAL_STEP_KEY), dict) else None,
    )


def graph_sha256(graph: Any) -> str:
    """Hex SHA-256 of an ONNX ``GraphProto``'s initializers and nodes (needs only ``onnx``).

    Initializers in name order: name, element type, dims, raw little-endian bytes; then nodes in
    graph order: operator, inputs, outputs and each attribute's serialized form."""
    from onnx import numpy_helper

    digest = hashlib.sha256()
    for init in sorted(graph.initializer, key=lambda t: t.name):
        array = numpy_helper.to_array(init)
        digest.update(f"I{init.name}|{init.data_type}|{tuple(init.dims)}|".encode())
        digest.update(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    for node in graph.node:
        digest.update(f"N{node.op_type}|{list(node.input)}|{list(node.output)}|".encode())
        for attr in sorted(node.attribute, key=lambda a: a.name):
            digest.update(attr.SerializeToString(deterministic=True))
    return digest.hexdigest()


def onnx_file_sha256(path: Path) -> str:
    """:func:`graph_sha256` of an ONNX file, computed from the file's bytes without the ``onnx``
    package (:mod:`embodied.onnx_wire`); a file that is not an ONNX model raises naming it."""
    from embodied.onnx_wire import graph_sha256_of, read_model

    return graph_sha256_of(read_model(path))


def check_model_hash(
    onnx_metadata: Mapping[str, str], policy_io: PolicyIO, onnx_path: Path, expected: str | None = None
) -> None:
    """Raise unless the ONNX file's ``model_sha256`` metadata and the hash of its weights and
    graph (:func:`onnx_file_sha256`) both equal ``policy_io.json``'s.

    ``onnx_metadata`` is the model's metadata map (onnxruntime's ``custom_metadata_map``);
    ``policy_io`` is what :func:`read_policy_io` returned; ``expected``: the hash this file must
    have when it is not ``policy_io.model_sha256`` (a second graph of the export).
    """
    want = policy_io.model_sha256 if expected is None else expected
    found = onnx_metadata.get("model_sha256")
    if found != want:
        raise EmbodiedError(
            f"{onnx_path}: model_sha256 {(found or '<missing>')[:12]} does not match {policy_io.path} "
            f"({want[:12]}); the two files come from different exports: re-export the run"
        )
    # The metadata could be copied onto other weights: hash what the file actually computes.
    actual = onnx_file_sha256(onnx_path)
    if actual != want:
        raise EmbodiedError(
            f"{onnx_path}: its weights and graph hash to {actual[:12]}, not the model_sha256 "
            f"{want[:12]} of {policy_io.path}: the file was altered or damaged; re-export the run"
        )


def check_session_hash(session: Any, policy_io: PolicyIO, onnx_path: Path, expected: str | None = None) -> None:
    """:func:`check_model_hash` on an onnxruntime ``InferenceSession`` of ``onnx_path``: its
    metadata map is read here because onnxruntime raises a bare ``UnicodeDecodeError`` for
    metadata that is not UTF-8 (a damaged file), which becomes a named error."""
    try:
        metadata = session.get_modelmeta().custom_metadata_map
    except UnicodeDecodeError:
        raise EmbodiedError(
            f"{onnx_path}: its metadata is not UTF-8 text: the file is damaged; re-export the run"
        ) from None
    check_model_hash(metadata, policy_io, onnx_path, expected)


MAX_POLICY_IO_BYTES = 1 << 20
"""Largest ``policy_io.json`` read (1 MiB; exports write a few kB)."""


def read_policy_io(path: Path) -> PolicyIO:
    """Read and validate ``policy_io.json`` (a file, or a directory that contains one)."""
    path = Path(path)
    if path.is_dir():
        path = path / POLICY_IO_FILENAME
    if not path.is_file():
        raise EmbodiedError(f"{path}: not found; run `embodied export RUN_DIR` first")
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_IO_BYTES:
            raise _fail(path, f"{size} bytes, larger than any policy_io.json (at most {MAX_POLICY_IO_BYTES})")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise _fail(path, f"not UTF-8 text (offset {err.start}); re-export the run") from None
    except ValueError as err:  # JSONDecodeError, and an integer of more digits than Python converts
        raise _fail(path, f"not valid JSON ({' '.join(str(err).split())[:200]})") from None
    except RecursionError:
        raise _fail(path, "not valid JSON (nested too deeply)") from None
    except OSError as err:
        raise _fail(path, f"cannot read: {err.strerror or err}") from None
    return _validate(path, data)
