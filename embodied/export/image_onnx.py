"""ONNX export of image policies: ``(obs [B, D] float32, image [B, H, W, 3] uint8) -> action``.

An image policy's ``export_module()`` (``policies/cnn.py`` ``ImageExportedPolicy``) carries
convolutions, which no policy artifact kind describes yet, so its ONNX graph is traced
(:func:`embodied.export.onnx_traced.export_traced_inputs`) with two inputs, ``obs`` and
``image``, and checked against torch with onnxruntime on probes that span the normalizer's
range and random pixels (plus recorded rollout inputs when given). ``policy_io.json`` gains a
top-level ``image_input`` that tells a deployment what to feed::

    "image_input": {"name": "image", "shape": ["batch", H, W, 3], "dtype": "uint8",
                    "layout": "NHWC", "channels": "RGB", "range": [0, 255], "camera": "top"}

The C exporter refuses these policies (:func:`embodied.export.layers.mlp_arrays` names the first
convolution).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.onnx import OnnxExport
from embodied.export.onnx_traced import export_traced_inputs
from embodied.export.policy_io import write_policy_io
from embodied.io_spec import IOSpec

IMAGE_INPUT_KEY = "image_input"
"""Top-level ``policy_io.json`` key describing the image input of an image policy."""


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
    mean = np.asarray(module.obs_mean, dtype=np.float32)  # type: ignore[arg-type]
    std = np.asarray(module.obs_std, dtype=np.float32)  # type: ignore[arg-type]
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
    obs_dim = int(module.obs_mean.shape[0])  # type: ignore[union-attr, index]
    if obs_dim != io_spec.obs_dim:
        raise EmbodiedError(f"policy reads {obs_dim} observations but its policy_io describes {io_spec.obs_dim}")
    probes = probe_inputs(module)
    if recorded is not None:
        probes = {
            "obs": np.concatenate([probes["obs"], np.asarray(recorded["obs"], dtype=np.float32)]),
            "image": np.concatenate([probes["image"], np.asarray(recorded["image"], dtype=np.uint8)]),
        }
    examples = {"obs": torch.zeros(2, obs_dim), "image": torch.zeros(2, *shape, dtype=torch.uint8)}
    report = export_traced_inputs(module, examples, export_dir, probes)
    entry = image_input_entry(shape, camera)
    write_policy_io(Path(export_dir), io_spec, report.model_sha256, source_run, **{IMAGE_INPUT_KEY: entry})
    return report
