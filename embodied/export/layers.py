"""Read an :class:`~embodied.policies.mlp.ExportedPolicy` into plain arrays for the exporters.

ONNX and C99 both express exactly this: ``clamp(net(clamp((obs - mean) / std, ±clip)), ±1)``
where ``net`` alternates ``Linear`` layers and element-wise activations, optionally inside the
module's symmetry flip (:class:`SymmetryArrays`). Anything else is rejected here, once, with
the offending layer named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError, NonFiniteError
from embodied.io_spec import IOSpec

SUPPORTED_ACTIVATIONS: dict[type[nn.Module], str] = {nn.Tanh: "tanh", nn.ELU: "elu", nn.ReLU: "relu"}


def activation_name(layer: nn.Module, activations: dict[type[nn.Module], str] = SUPPORTED_ACTIVATIONS) -> str | None:
    """Exported name of an activation module (subclasses count, e.g. the fast CPU ``Tanh``), or None."""
    for kind, name in activations.items():
        if isinstance(layer, kind):
            return name
    return None


@dataclass(frozen=True)
class DenseLayer:
    """``y = act(x @ weight.T + bias)``; ``weight`` [out, in] float32 row-major, ``bias`` [out]."""

    weight: np.ndarray
    bias: np.ndarray
    activation: str
    """``"tanh"``, ``"elu"``, ``"relu"`` or ``"none"``."""
    elu_alpha: float = 1.0

    @property
    def in_dim(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_dim(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class SymmetryArrays:
    """The policy's symmetry flip (``ExportedPolicy.with_symmetry``): where
    ``obs[select_index] < 0`` the network sees ``obs[obs_source] * obs_sign`` and the action is
    ``out[action_source]``."""

    select_index: int
    obs_source: np.ndarray
    """``[obs_dim]`` int64."""
    obs_sign: np.ndarray
    """``[obs_dim]`` float32, each +-1."""
    action_source: np.ndarray
    """``[action_dim]`` int64, a permutation."""


@dataclass(frozen=True)
class MlpArrays:
    """The whole exported policy as float32 arrays (``obs_mean``/``obs_std`` [obs_dim])."""

    obs_mean: np.ndarray
    obs_std: np.ndarray
    obs_clip: float
    layers: tuple[DenseLayer, ...]
    symmetry: SymmetryArrays | None = None

    @property
    def obs_dim(self) -> int:
        return int(self.obs_mean.shape[0])

    @property
    def action_dim(self) -> int:
        return self.layers[-1].out_dim

    @property
    def num_macs(self) -> int:
        """Multiply-accumulates per forward pass (the sum of ``in * out`` over layers)."""
        return sum(layer.in_dim * layer.out_dim for layer in self.layers)


def finite_array(name: str, array: np.ndarray) -> np.ndarray:
    """``array`` unchanged, or :class:`NonFiniteError` naming ``name`` when it holds NaN/inf."""
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise NonFiniteError(f"{name} holds {bad} NaN/inf value(s); the policy cannot be exported")
    return array


def float32_array(t: torch.Tensor) -> np.ndarray:
    """A contiguous float32 CPU copy of ``t``."""
    return np.ascontiguousarray(t.detach().float().cpu().numpy(), dtype=np.float32)


def dense_layers(
    net: object, name: str, activations: dict[type[nn.Module], str] = SUPPORTED_ACTIVATIONS
) -> tuple[DenseLayer, ...]:
    """The ``Linear`` layers of ``net`` (an ``nn.Sequential`` called ``name`` in errors), each with
    the activation that follows it (one of ``activations``, or "none").

    Raises :class:`EmbodiedError` naming the layer for anything else, and
    :class:`NonFiniteError` for a NaN/inf weight or bias."""
    if not isinstance(net, nn.Sequential):
        raise EmbodiedError(f"export needs {name} to be an nn.Sequential, got {type(net).__name__}")
    layers: list[DenseLayer] = []
    for index, layer in enumerate(net):
        where = f"{name}[{index}] ({type(layer).__name__})"
        if isinstance(layer, nn.Linear):
            weight = finite_array(f"{where} weight", float32_array(layer.weight))
            if layer.bias is not None:
                bias = finite_array(f"{where} bias", float32_array(layer.bias))
            else:
                bias = np.zeros(weight.shape[0], dtype=np.float32)
            if layers and layers[-1].out_dim != weight.shape[1]:
                raise EmbodiedError(f"{where} expects {weight.shape[1]} inputs but receives {layers[-1].out_dim}")
            layers.append(DenseLayer(weight, bias, "none"))
        elif (act_name := activation_name(layer, activations)) is not None:
            if not layers or layers[-1].activation != "none":
                raise EmbodiedError(f"{where}: an activation must directly follow a Linear layer")
            alpha = float(getattr(layer, "alpha", 1.0))
            previous = layers[-1]
            layers[-1] = DenseLayer(previous.weight, previous.bias, act_name, alpha)
        else:
            supported = ", ".join(["Linear", *(t.__name__ for t in activations)])
            raise EmbodiedError(f"{where} cannot be exported to ONNX/C; supported layers: {supported}")
    if not layers:
        raise EmbodiedError(f"the exported {name} has no Linear layer")
    return tuple(layers)


LAYER_ACTIVATIONS: dict[str, Callable[[float], nn.Module]] = {
    "tanh": lambda _: nn.Tanh(),
    "relu": lambda _: nn.ReLU(),
    "elu": lambda alpha: nn.ELU(alpha=alpha),
    "mish": lambda _: nn.Mish(),
}
"""A described layer's ``activation`` -> its torch module given ``elu_alpha`` (the rebuild
direction of :func:`dense_layers`)."""


def activation_module(name: str, elu_alpha: float, where: str) -> nn.Module:
    """The torch module of activation ``name`` (``elu_alpha`` for ELU); ``where`` names the
    described layer in the :class:`EmbodiedError` for an unknown name."""
    if name not in LAYER_ACTIVATIONS:
        raise EmbodiedError(f"{where}: unknown activation {name!r} (known: {', '.join(LAYER_ACTIVATIONS)})")
    return LAYER_ACTIVATIONS[name](elu_alpha)


def sequential_from_layers(layers: tuple[DenseLayer, ...], name: str) -> nn.Sequential:
    """The ``nn.Sequential`` of float32 ``Linear`` + activation modules that ``layers`` describe."""
    modules: list[nn.Module] = []
    for index, layer in enumerate(layers):
        linear = nn.Linear(layer.in_dim, layer.out_dim)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.array(layer.weight, dtype=np.float32)))
            linear.bias.copy_(torch.from_numpy(np.array(layer.bias, dtype=np.float32)))
        modules.append(linear)
        if layer.activation != "none":
            modules.append(activation_module(layer.activation, layer.elu_alpha, f"{name} layers[{index}]"))
    return nn.Sequential(*modules)


def normalizer_arrays(module: nn.Module, obs_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``module``'s ``obs_mean`` and ``obs_std`` ``[obs_dim]``, finite, the std positive."""
    mean_t, std_t = getattr(module, "obs_mean", None), getattr(module, "obs_std", None)
    if not (isinstance(mean_t, torch.Tensor) and isinstance(std_t, torch.Tensor)):
        raise EmbodiedError("obs_mean and obs_std must be tensors")
    mean = finite_array("obs_mean", float32_array(mean_t))
    std = finite_array("obs_std", float32_array(std_t))
    if np.any(std <= 0):
        raise EmbodiedError(f"obs_std has {int(np.sum(std <= 0))} non-positive entries")
    if mean.shape != (obs_dim,) or std.shape != mean.shape:
        raise EmbodiedError(
            f"obs_mean/obs_std have shape {mean.shape}/{std.shape} but the network takes {obs_dim} observations"
        )
    return mean, std


EXPORTED_POLICY_ATTRS: tuple[str, ...] = ("net", "obs_mean", "obs_std", "obs_clip")
"""What an ``ExportedPolicy``-shaped module carries; :func:`mlp_arrays` reads exactly these."""


def layers_outside_net(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(dotted name, layer)`` of every weight-carrying layer of ``module`` that is not part of
    its ``net`` (e.g. an image policy's convolutions): layers an MLP description would drop."""
    return [
        (name, layer)
        for name, layer in module.named_modules()
        if name != "net"
        and not name.startswith("net.")
        and any(True for _ in layer.parameters(recurse=False))
        and name != ""
    ]


def conv_text(in_channels: int, out_channels: int, kernel: tuple[int, int], stride: int) -> str:
    """``Conv2d(3 -> 16, kernel 8x8, stride 4)``: how errors name a convolution."""
    return f"Conv2d({in_channels} -> {out_channels}, kernel {kernel[0]}x{kernel[1]}, stride {stride})"


def describe_layer(layer: nn.Module) -> str:
    """``Conv2d(3 -> 16, kernel 8x8, stride 4)``-style description of a layer for error messages."""
    if isinstance(layer, nn.Conv2d):
        kh, kw = layer.kernel_size
        return conv_text(layer.in_channels, layer.out_channels, (kh, kw), layer.stride[0])
    if isinstance(layer, nn.Linear):
        return f"Linear({layer.in_features} -> {layer.out_features})"
    return type(layer).__name__


def mlp_arrays(module: nn.Module) -> MlpArrays:
    """Validate ``module`` (an ExportedPolicy) and return its arrays.

    Raises :class:`EmbodiedError` naming the layer when the network holds anything but
    ``Linear`` layers each followed by at most one supported activation, and
    :class:`NonFiniteError` when a weight, bias or normalizer entry is NaN/inf.
    """
    for attr in EXPORTED_POLICY_ATTRS:
        if not hasattr(module, attr):
            raise EmbodiedError(
                f"{type(module).__name__} has no {attr!r}: exporters take Policy.export_module() "
                "(an ExportedPolicy), not the training policy"
            )
    outside = layers_outside_net(module)
    if outside:
        name, layer = outside[0]
        raise EmbodiedError(
            f"{type(module).__name__} layer {name!r} ({describe_layer(layer)}) is not an MLP layer: the C exporter "
            "and the MLP policy artifact hold Linear layers and activations only; export this policy with "
            "--format onnx"
        )
    layers = dense_layers(module.net, "net")
    mean, std = normalizer_arrays(module, layers[0].in_dim)
    clip = float(module.obs_clip)  # type: ignore[arg-type]  # a float attribute of ExportedPolicy
    if math.isnan(clip) or clip <= 0:
        raise EmbodiedError(f"obs_clip must be positive (or inf), got {clip}")
    return MlpArrays(mean, std, clip, layers, _symmetry(module))


def _symmetry(module: nn.Module) -> SymmetryArrays | None:
    """The module's symmetry flip (validated by ``ExportedPolicy.with_symmetry``), or None."""
    select = getattr(module, "sym_select_index", None)
    if select is None:
        return None
    tensors = [getattr(module, name) for name in ("sym_obs_source", "sym_obs_sign", "sym_action_source")]
    source, sign, action_source = (t.detach().cpu().numpy() for t in tensors)
    return SymmetryArrays(int(select), source.astype(np.int64), sign.astype(np.float32), action_source.astype(np.int64))


SYMMETRY_EXTRA_KEY = "yaw_symmetry"
"""``policy_io.json`` ``extra`` key of a task's symmetry tables (``tasks/quadrotor/terms.py``)."""


def with_io_symmetry(module: nn.Module, io_spec: IOSpec) -> nn.Module:
    """``module`` with the symmetry flip ``io_spec`` declares (``extra.yaw_symmetry``) put around
    it, so the exported policy takes and returns physical quantities; unchanged when the spec
    declares none or the module already has one. Raises :class:`EmbodiedError` when the spec
    declares one and the module cannot carry it."""
    tables = io_spec.extra.get(SYMMETRY_EXTRA_KEY)
    if tables is None or getattr(module, "sym_select_index", None) is not None:
        return module
    with_symmetry = getattr(module, "with_symmetry", None)
    if with_symmetry is None:
        raise EmbodiedError(
            f"policy_io declares extra.{SYMMETRY_EXTRA_KEY} but {type(module).__name__} cannot carry it; "
            "export Policy.export_module() (an ExportedPolicy)"
        )
    try:
        out: nn.Module = with_symmetry(tables)
    except ValueError as err:
        raise EmbodiedError(f"policy_io extra.{SYMMETRY_EXTRA_KEY}: {err}") from None
    return out
