"""ONNX export of image policies: ``(obs [B, D] float32, image [B, H, W, 3] uint8) -> action``.

An image policy (``policies/cnn.py`` ``ImageExportedPolicy``, the module of the policy
artifact kind ``image``, :mod:`embodied.export.image_arrays`) carries convolutions; its ONNX graph
is traced (:func:`embodied.export.onnx_traced.export_traced_inputs`) with two inputs, ``obs`` and
``image``, and checked against torch with onnxruntime on probes that span the normalizer's
range and random pixels (plus recorded rollout inputs when given). ``policy_io.json`` gains a
top-level ``image_input`` that tells a deployment what to feed::

    "image_input": {"name": "image", "shape": ["batch", H, W, 3], "dtype": "uint8",
                    "layout": "NHWC", "channels": "RGB", "range": [0, 255], "camera": "top"}

``model_sha256`` is the traced graph's hash (:func:`image_model_sha256`), so the weights of an
image policy are compared by tracing its module again, never with
:func:`~embodied.export.policy_io.weights_sha256` (the hash of an MLP graph). The C exporter
refuses these policies, naming the first convolution. ``embodied deploy`` feeds them from the
robot config's ``camera`` input (:mod:`embodied.real.camera_image`) and refuses them on a robot
config without one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.env import IMAGE_GROUP, ObsDict
from embodied.errors import EmbodiedError
from embodied.export.onnx import OnnxExport
from embodied.export.onnx_traced import export_traced_inputs, traced_model
from embodied.export.policy_io import ONNX_FILENAME, POLICY_IO_FILENAME, read_policy_io, write_policy_io
from embodied.io_spec import IOSpec
from embodied.policy_io import IMAGE_INPUT_KEY, check_session_hash, graph_sha256

__all__ = [
    "IMAGE_INPUT_KEY",
    "export_image_onnx",
    "image_input_entry",
    "image_input_of",
    "image_model_sha256",
    "image_shape_of",
    "load_image_onnx_policy",
    "probe_inputs",
    "record_inputs",
]


def image_shape_of(module: nn.Module) -> tuple[int, int, int] | None:
    """``(H, W, 3)`` an exported module reads as its second input, or None for a vector policy."""
    shape = getattr(module, "image_shape", None)
    return None if shape is None else (int(shape[0]), int(shape[1]), int(shape[2]))


def image_input_entry(image_shape: tuple[int, int, int], camera: str = "") -> dict[str, Any]:
    """The ``policy_io.json`` ``image_input`` entry for images of ``image_shape`` from ``camera``."""
    return {
        "name": "image",
        "shape": ["batch", *image_shape],
        "dtype": "uint8",
        "layout": "NHWC",
        "channels": "RGB",
        "range": [0, 255],
        "camera": camera,
    }


def probe_inputs(module: nn.Module, num: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """``{"obs": [num, D] float32, "image": [num, H, W, 3] uint8}``: observations uniform over ±4
    std around the normalizer's mean (so its clip engages) and uniformly random pixels."""
    shape = image_shape_of(module)
    if shape is None:
        raise EmbodiedError(f"{type(module).__name__} reads no images")
    rng = np.random.default_rng(seed)
    mean = np.asarray(module.obs_mean, dtype=np.float32)
    std = np.asarray(module.obs_std, dtype=np.float32)
    obs = (mean + rng.uniform(-4.0, 4.0, size=(num, len(mean))).astype(np.float32) * std).astype(np.float32)
    return {"obs": obs, "image": rng.integers(0, 256, size=(num, *shape), dtype=np.uint8)}


@torch.inference_mode()
def record_inputs(module: nn.Module, env: Any, steps: int) -> dict[str, np.ndarray]:
    """``{"obs": [steps * N, D], "image": [steps * N, H, W, 3]}`` visited by ``module`` acting in
    ``env`` (a VecEnv with camera images) from ``reset(seed=0)``."""
    obs = env.reset(seed=0)
    rows: dict[str, list[np.ndarray]] = {"obs": [], "image": []}
    for _ in range(steps):
        x, image = obs["policy"].detach().to("cpu", torch.float32), obs["image"].detach().cpu()
        rows["obs"].append(x.numpy())
        rows["image"].append(image.numpy())
        obs, *_ = env.step(module(x, image).to(env.device))
    return {name: np.concatenate(parts) for name, parts in rows.items()}


def export_image_onnx(
    module: nn.Module,
    io_spec: IOSpec,
    export_dir: Path,
    recorded: dict[str, np.ndarray] | None = None,
    camera: str = "",
    source_run: str = "",
) -> OnnxExport:
    """Write ``export_dir/policy.onnx`` (inputs ``obs``, ``image``) and ``policy_io.json``.

    ``recorded``: ``{"obs": [N, D], "image": [N, H, W, 3]}`` from a rollout, checked besides the
    probes. Raises :class:`EmbodiedError` when the sizes disagree with ``io_spec`` or onnxruntime
    differs from torch by more than :data:`embodied.export.onnx.PARITY_TOL`."""
    shape = image_shape_of(module)
    if shape is None:
        raise EmbodiedError(f"{type(module).__name__} reads no images: export it with export_onnx")
    obs_dim = int(np.asarray(module.obs_mean).shape[0])
    if obs_dim != io_spec.obs_dim:
        raise EmbodiedError(f"policy reads {obs_dim} observations but its policy_io describes {io_spec.obs_dim}")
    probes = probe_inputs(module)
    if recorded is not None:
        probes = {
            "obs": np.concatenate([probes["obs"], np.asarray(recorded["obs"], dtype=np.float32)]),
            "image": np.concatenate([probes["image"], np.asarray(recorded["image"], dtype=np.uint8)]),
        }
    report = export_traced_inputs(module, _examples(module, shape), export_dir, probes)
    entry = image_input_entry(shape, camera)
    write_policy_io(Path(export_dir), io_spec, report.model_sha256, source_run, **{IMAGE_INPUT_KEY: entry})
    return report


def _examples(module: nn.Module, shape: tuple[int, int, int]) -> dict[str, torch.Tensor]:
    """The tracing inputs: ``obs [2, D]`` float32 zeros and ``image [2, H, W, C]`` uint8 zeros."""
    obs_dim = int(np.asarray(module.obs_mean).shape[0])
    return {"obs": torch.zeros(2, obs_dim), "image": torch.zeros(2, *shape, dtype=torch.uint8)}


def image_model_sha256(module: nn.Module) -> str:
    """The ``model_sha256`` :func:`export_image_onnx` records for ``module``: the
    :func:`graph_sha256` of its traced graph (traced again here, nothing written)."""
    shape = image_shape_of(module)
    if shape is None:
        raise EmbodiedError(f"{type(module).__name__} reads no images")
    return graph_sha256(traced_model(module, _examples(module, shape)).graph)


def image_input_of(export_dir: Path) -> dict[str, Any] | None:
    """``policy_io.json``'s ``image_input`` in ``export_dir`` (None: a vector policy or no file)."""
    path = Path(export_dir) / POLICY_IO_FILENAME
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get(IMAGE_INPUT_KEY)
    return entry if isinstance(entry, dict) else None


def load_image_onnx_policy(export_dir: Path, env: Any) -> Callable[[ObsDict], torch.Tensor]:
    """``obs -> action [N, A]`` running ``export_dir/policy.onnx`` of an image policy on
    onnxruntime, fed ``obs["policy"]`` and ``obs["image"]``; checks the sizes against the env and
    the file's hash against ``policy_io.json``."""
    import onnxruntime as ort

    export_dir = Path(export_dir)
    policy_io = read_policy_io(export_dir)
    entry = image_input_of(export_dir)
    if entry is None:
        raise EmbodiedError(f"{policy_io.path} describes no image input")
    image_shape = tuple(int(v) for v in entry["shape"][1:])
    env_image = tuple(env.obs_spec.get(IMAGE_GROUP, ()))
    if int(env.obs_spec["policy"][0]) != policy_io.io_spec.obs_dim or env_image != image_shape:
        raise EmbodiedError(
            f"{policy_io.path} reads obs [{policy_io.io_spec.obs_dim}] and images {image_shape}, but the env gives "
            f"[{env.obs_spec['policy'][0]}] and {env_image or 'no images'} (camera {entry.get('camera', '')!r})"
        )
    path = export_dir / ONNX_FILENAME
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    check_session_hash(session, policy_io, path)

    def act(obs: ObsDict) -> torch.Tensor:
        feeds = {
            "obs": np.ascontiguousarray(obs["policy"].detach().to("cpu", torch.float32).numpy()),
            "image": np.ascontiguousarray(obs[IMAGE_GROUP].detach().cpu().numpy()),
        }
        (out,) = session.run(["action"], feeds)
        return torch.from_numpy(np.asarray(out)).to(env.device)

    return act
