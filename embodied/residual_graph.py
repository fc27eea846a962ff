"""The second graph of a residual export whose base keeps state between calls.

A residual policy on a base that runs its action chunks open-loop (``exec_steps > 1``) or
blends its last chunks (``temporal_ensemble``) is not a function of the current observation:
the base's action depends on the plans it made before. Such a run exports as two graphs:
``policy.onnx`` is the base's planner (``obs [N, D] -> plan [N, H, A]``, executed by
:class:`embodied.action_chunks.ChunkExecutor` as ``extra.action_chunk`` says), and
``residual.onnx`` maps ``(obs [N, D], base_action [N, A]) -> action [N, A]``, applied to
every executed base action, exactly as :meth:`ResidualPolicy.act` does in training.

``policy_io.json`` names the second graph under :data:`RESIDUAL_STEP_KEY`::

    "residual_step": {"file": "residual.onnx", "model_sha256": "<64 hex>",
                      "obs_input": "obs", "base_action_input": "base_action"}

This module imports neither torch nor numpy (the deploy runtime and ``embodied eval --policy
onnx`` both use it); sessions are onnxruntime ``InferenceSession`` objects made by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embodied.errors import EmbodiedError
from embodied.policy_io import RESIDUAL_STEP_KEY, PolicyIO, check_session_hash

RESIDUAL_FILENAME = "residual.onnx"
OBS_INPUT = "obs"
BASE_ACTION_INPUT = "base_action"


def residual_step_entry(model_sha256: str) -> dict[str, str]:
    """The ``policy_io.json`` entry describing ``residual.onnx`` with hash ``model_sha256``."""
    return {
        "file": RESIDUAL_FILENAME,
        "model_sha256": model_sha256,
        "obs_input": OBS_INPUT,
        "base_action_input": BASE_ACTION_INPUT,
    }


class ResidualGraph:
    """``graph(obs [N, D], base_action [N, A]) -> action [N, A]`` on onnxruntime, checked
    against ``policy_io.json``'s :data:`RESIDUAL_STEP_KEY` entry (file, hash, input names, sizes)."""

    def __init__(self, export_dir: Path, policy_io: PolicyIO, make_session: Callable[[Path], Any]) -> None:
        entry = policy_io.residual_step
        where = f"{policy_io.path}: {RESIDUAL_STEP_KEY}"
        if entry is None:
            raise EmbodiedError(f"{policy_io.path}: no {RESIDUAL_STEP_KEY} entry; this export has one graph")
        keys = ("file", "model_sha256", "obs_input", "base_action_input")
        if not all(isinstance(entry.get(k), str) for k in keys):
            raise EmbodiedError(f"{where}: expected string keys {', '.join(keys)}, got {entry!r}; re-export the run")
        name = str(entry["file"])
        if Path(name).name != name:
            raise EmbodiedError(f"{where}.file must name a file inside the export folder, got {name!r}")
        path = Path(export_dir) / name
        if not path.is_file():
            raise EmbodiedError(f"{path}: not found, but {policy_io.path} names it; re-export the run")
        self.session = make_session(path)
        check_session_hash(self.session, policy_io, path, str(entry["model_sha256"]))
        self.obs_name, self.base_name = str(entry["obs_input"]), str(entry["base_action_input"])
        inputs = {i.name: list(i.shape[1:]) for i in self.session.get_inputs()}
        spec = policy_io.io_spec
        want = {self.obs_name: [spec.obs_dim], self.base_name: [spec.action_dim]}
        outputs = self.session.get_outputs()
        if inputs != want or len(outputs) != 1 or list(outputs[0].shape[1:]) != [spec.action_dim]:
            raise EmbodiedError(
                f"{path} takes {inputs} and returns {[list(o.shape[1:]) for o in outputs]}, but {policy_io.path} "
                f"describes inputs {want} and one output [{spec.action_dim}]; re-export the run"
            )
        self.output_name = outputs[0].name

    def __call__(self, obs: Any, base_action: Any) -> Any:
        """Combined actions ``[N, A]`` float32 for ``obs [N, D]`` and the executed ``base_action [N, A]``."""
        (out,) = self.session.run([self.output_name], {self.obs_name: obs, self.base_name: base_action})
        return out
