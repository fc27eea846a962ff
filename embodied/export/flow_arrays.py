"""A flow-matching policy's deterministic sampler (``policies/flow.py`` ``FlowSampler``) as
plain arrays: the policy artifact's kind ``flow`` and the source of its ONNX graph.

The sampler computes, for ``obs [B, D]``::

    obs_n = clamp((obs - obs_mean) / obs_std, +-obs_clip)
    x = x0                                     # [F], F = H * A, the fixed (or zero) start
    for k in 0 .. K-1:  x = x + v(cat(obs_n, x, time_feats[k])) / K
    chunk = clamp(x, -1, 1).reshape(B, H, A)

where ``v`` is an MLP (``layers``: Linear + tanh/elu/relu/mish). Receding-horizon execution
(``exec_steps`` of the ``H`` actions, then plan again, or the temporal ensemble) is the
caller's job (:mod:`embodied.action_chunks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.action_chunks import ChunkSpec
from embodied.errors import EmbodiedError
from embodied.export.layers import (
    SUPPORTED_ACTIVATIONS,
    DenseLayer,
    dense_layers,
    finite_array,
    float32_array,
    normalizer_arrays,
    sequential_from_layers,
)

FLOW_ACTIVATIONS: dict[type[nn.Module], str] = {**SUPPORTED_ACTIVATIONS, nn.Mish: "mish"}
"""Activations a flow sampler's velocity network may use (ONNX: Mish as x * tanh(softplus(x)))."""

FLOW_SAMPLER_ATTRS: tuple[str, ...] = ("velocity", "obs_mean", "obs_std", "time_feats", "x0", "chunk", "exec_steps")
"""What a ``FlowSampler``-shaped module carries; :func:`flow_arrays` reads exactly these (and ``obs_clip``)."""


@dataclass(frozen=True)
class FlowArrays:
    """The sampler as float32 arrays: ``obs_mean``/``obs_std [D]``, ``time_feats [K, E]``,
    ``x0 [F]``; ``layers`` the velocity MLP (input ``D + F + E``, output ``F``)."""

    obs_mean: np.ndarray
    obs_std: np.ndarray
    obs_clip: float
    layers: tuple[DenseLayer, ...]
    time_feats: np.ndarray
    x0: np.ndarray
    chunk: int
    exec_steps: int
    temporal_ensemble: bool = False

    @property
    def obs_dim(self) -> int:
        return int(self.obs_mean.shape[0])

    @property
    def flat_dim(self) -> int:
        return int(self.x0.shape[0])

    @property
    def action_dim(self) -> int:
        return self.flat_dim // self.chunk

    @property
    def steps(self) -> int:
        return int(self.time_feats.shape[0])

    @property
    def symmetry(self) -> None:
        """Flow samplers carry no symmetry flip (the probes read this)."""
        return None

    @property
    def chunk_spec(self) -> ChunkSpec:
        return ChunkSpec(self.chunk, self.exec_steps, self.temporal_ensemble)

    @property
    def num_macs(self) -> int:
        """Multiply-accumulates per plan: ``K`` calls of the velocity MLP."""
        return self.steps * sum(layer.in_dim * layer.out_dim for layer in self.layers)


def is_flow_sampler(module: nn.Module) -> bool:
    """Whether ``module`` has the attributes of a ``FlowSampler``."""
    return all(hasattr(module, attr) for attr in FLOW_SAMPLER_ATTRS)


def flow_arrays(module: nn.Module) -> FlowArrays:
    """Validate a ``FlowSampler`` and return its arrays; errors name the attribute or layer."""
    for attr in FLOW_SAMPLER_ATTRS:
        if not hasattr(module, attr):
            raise EmbodiedError(
                f"{type(module).__name__} has no {attr!r}: not a flow sampler (FlowPolicy.export_module())"
            )
    layers = dense_layers(module.velocity, "velocity", FLOW_ACTIVATIONS)
    attrs: dict[str, Any] = {attr: getattr(module, attr) for attr in FLOW_SAMPLER_ATTRS}
    time_feats = finite_array("time_feats", float32_array(attrs["time_feats"]))
    x0 = finite_array("x0", float32_array(attrs["x0"]))
    chunk, exec_steps = int(attrs["chunk"]), int(attrs["exec_steps"])
    if time_feats.ndim != 2 or time_feats.shape[0] < 1:
        raise EmbodiedError(f"time_feats must be [K >= 1, E], got shape {time_feats.shape}")
    if x0.ndim != 1 or chunk < 1 or x0.shape[0] % chunk:
        raise EmbodiedError(f"x0 must be [chunk * action_dim] with chunk={chunk}, got shape {x0.shape}")
    ensemble = bool(getattr(module, "temporal_ensemble", False))
    ChunkSpec(chunk, exec_steps, ensemble)  # validates 1 <= exec_steps <= chunk
    flat = x0.shape[0]
    obs_dim = layers[0].in_dim - flat - time_feats.shape[1]
    if obs_dim < 1 or layers[-1].out_dim != flat:
        raise EmbodiedError(
            f"velocity maps {layers[0].in_dim} -> {layers[-1].out_dim}, but x0 has {flat} entries and time_feats "
            f"{time_feats.shape[1]}: expected an input of obs_dim + {flat} + {time_feats.shape[1]} and an output of {flat}"
        )
    mean, std = normalizer_arrays(module, obs_dim)
    clip = float(getattr(module, "obs_clip", math.inf))
    if math.isnan(clip) or clip <= 0:
        raise EmbodiedError(f"obs_clip must be positive (or inf), got {clip}")
    return FlowArrays(mean, std, clip, layers, time_feats, x0, chunk, exec_steps, ensemble)


def build_flow(arrays: FlowArrays) -> nn.Module:
    """The float32 CPU ``FlowSampler`` whose :func:`flow_arrays` is ``arrays``."""
    from embodied.policies.flow import FlowSampler

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.float32))

    return FlowSampler(
        sequential_from_layers(arrays.layers, "velocity"),
        tensor(arrays.obs_mean),
        tensor(arrays.obs_std),
        tensor(arrays.time_feats),
        tensor(arrays.x0),
        arrays.chunk,
        arrays.exec_steps,
        arrays.obs_clip,
        arrays.temporal_ensemble,
    )
