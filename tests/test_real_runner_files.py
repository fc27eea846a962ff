"""The robot-side runner refuses damaged ONNX files with a named error, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_support import export_policy, quad_spec

from embodied.errors import EmbodiedError
from embodied.real.runner import PolicyRunner


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return export_policy(tmp_path / "export", quad_spec(history=1), seed=1)


def test_metadata_that_is_not_utf8_is_a_named_error(export: Path) -> None:
    # A damaged byte inside the model_sha256 metadata value: protobuf still parses the file, but
    # onnxruntime cannot decode the metadata string (it raises a bare UnicodeDecodeError).
    onnx_path = export / "policy.onnx"
    sha = json.loads((export / "policy_io.json").read_text())["model_sha256"].encode()
    data = onnx_path.read_bytes()
    at = data.index(sha)
    onnx_path.write_bytes(data[:at] + b"\xe5" + data[at + 1 :])
    with pytest.raises(EmbodiedError, match=r"policy\.onnx: its metadata is not UTF-8"):
        PolicyRunner(export)


def test_unloadable_onnx_is_a_named_error(export: Path) -> None:
    (export / "policy.onnx").write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(EmbodiedError, match=r"policy\.onnx: not a valid ONNX model"):
        PolicyRunner(export)


def test_intact_export_loads(export: Path) -> None:
    runner = PolicyRunner(export)
    assert runner.io_spec.obs_dim == quad_spec(history=1).obs_dim
