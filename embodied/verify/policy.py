"""Load an exported policy (``policy_io.json`` + ``policy.onnx``) as a batched numpy callable."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied.errors import EmbodiedError
from embodied.policy_io import ONNX_FILENAME, PolicyIO, check_session_hash, read_policy_io
from embodied.verify.episodes import ArrayPolicy


def load_exported_policy(export_dir: Path) -> tuple[ArrayPolicy, PolicyIO]:
    """``(policy, policy_io)`` from an export folder; the ONNX model runs on onnxruntime (CPU).

    Raises :class:`EmbodiedError` naming the file when either file is missing, unreadable, from
    another export (hash), or of the wrong input/output size.
    """
    import onnxruntime as ort

    policy_io = read_policy_io(export_dir)
    path = Path(export_dir) / ONNX_FILENAME
    if not path.is_file():
        raise EmbodiedError(f"{path}: not found; run `embodied export RUN_DIR --format onnx`")
    try:
        options = ort.SessionOptions()
        # One thread: a 64-wide MLP gains nothing from more, and spinning worker threads slow
        # everything else down on a small, shared CPU.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own types for corrupt or foreign files
        raise EmbodiedError(f"{path}: not a loadable ONNX model ({type(err).__name__}: {err})") from None
    check_session_hash(session, policy_io, path)
    shape_in = session.get_inputs()[0].shape
    shape_out = session.get_outputs()[0].shape
    spec = policy_io.io_spec
    if shape_in[-1] != spec.obs_dim or shape_out[-1] != spec.action_dim:
        raise EmbodiedError(
            f"{path}: maps {shape_in[-1]} -> {shape_out[-1]} but {policy_io.path} says {spec.obs_dim} -> {spec.action_dim}"
        )
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name

    def policy(obs: np.ndarray) -> np.ndarray:
        (action,) = session.run([output_name], {input_name: np.ascontiguousarray(obs, dtype=np.float32)})
        return np.asarray(action)

    return policy, policy_io
