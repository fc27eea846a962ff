"""An image policy (``policies/cnn.py`` ``ImageExportedPolicy``, what PPO's ``encoder: cnn`` and
the SAC/FastTD3 image actor export) as plain arrays: the policy artifact's kind ``image``.

The policy computes, for ``obs [B, D]`` float32 and ``image [B, H, W, C]`` uint8::

    x = permute(image, NHWC -> NCHW) * pixel_scale          # [B, C, H, W]
    for conv in convs:  x = act(conv2d(x, weight, bias, stride, padding))
    f = flatten(x)                                          # [B, K], channel-major
    f = act(layer_norm(f @ project.weight.T + project.bias))  # [B, F] (norm optional)
    obs_n = clamp((obs - obs_mean) / obs_std, +-obs_clip)
    action = clamp(head(cat(obs_n, f)), -1, 1)              # head: Linear + activation layers

The dense parts are :class:`~embodied.export.layers.DenseLayer` s, as in every other kind; the
convolutions are :class:`ConvLayer` s and the projection's LayerNorm a :class:`LayerNormArrays`.
:func:`image_arrays` validates a module (errors name the layer) and :func:`build_image` rebuilds
the float32 CPU module, layer for layer, so it computes the same actions and traces to the same
ONNX graph. No C exporter takes this kind: the first convolution is what it refuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError, NonFiniteError
from embodied.export.artifact_errors import PolicyArtifactError
from embodied.export.layers import (
    SUPPORTED_ACTIVATIONS,
    DenseLayer,
    activation_module,
    activation_name,
    conv_text,
    dense_layers,
    finite_array,
    float32_array,
    normalizer_arrays,
    sequential_from_layers,
)

IMAGE_POLICY_ATTRS: tuple[str, ...] = ("encoder", "net", "obs_mean", "obs_std", "obs_clip", "image_shape")
"""What an ``ImageExportedPolicy``-shaped module carries; :func:`image_arrays` reads these."""


@dataclass(frozen=True)
class ConvLayer:
    """``y = act(conv2d(x, weight, bias, stride, padding))`` over ``[B, in, h, w]``, zero padding;
    ``weight [out, in, kh, kw]`` float32, ``bias [out]``."""

    weight: np.ndarray
    bias: np.ndarray
    stride: tuple[int, int]
    padding: tuple[int, int]
    activation: str
    """``"tanh"``, ``"elu"``, ``"relu"`` or ``"none"``."""
    elu_alpha: float = 1.0

    @property
    def in_channels(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    @property
    def kernel(self) -> tuple[int, int]:
        return int(self.weight.shape[2]), int(self.weight.shape[3])

    def out_size(self, height: int, width: int) -> tuple[int, int]:
        """``(h, w)`` of the output map for an input map of ``height x width``."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        return (height + 2 * ph - kh) // sh + 1, (width + 2 * pw - kw) // sw + 1

    def text(self) -> str:
        """How errors name it: ``Conv2d(3 -> 16, kernel 8x8, stride 4)``."""
        return conv_text(self.in_channels, self.out_channels, self.kernel, self.stride[0])


@dataclass(frozen=True)
class LayerNormArrays:
    """``y = act((x - mean(x)) / sqrt(var(x) + eps) * weight + bias)`` over the last axis;
    ``weight``/``bias [F]`` float32."""

    weight: np.ndarray
    bias: np.ndarray
    eps: float
    activation: str
    elu_alpha: float = 1.0


@dataclass(frozen=True)
class ImageArrays:
    """The image policy as float32 arrays (see the module docstring for what it computes)."""

    image_shape: tuple[int, int, int]
    """``(H, W, C)`` of the uint8 images it reads, channels last."""
    pixel_scale: float
    """What each pixel is multiplied by before the first convolution (1/255)."""
    convs: tuple[ConvLayer, ...]
    project: DenseLayer
    """``[K] -> [F]``: the flattened last feature map to the image features."""
    project_norm: LayerNormArrays | None
    """The LayerNorm after ``project`` (with the features' activation), or None."""
    obs_mean: np.ndarray
    obs_std: np.ndarray
    obs_clip: float
    head: tuple[DenseLayer, ...]
    """``[D + F] -> [A]``: the action network over the normalized observation and the features."""

    @property
    def obs_dim(self) -> int:
        return int(self.obs_mean.shape[0])

    @property
    def action_dim(self) -> int:
        return self.head[-1].out_dim

    @property
    def features(self) -> int:
        return self.project.out_dim

    @property
    def symmetry(self) -> None:
        """Image policies carry no symmetry flip (the probes read this)."""
        return None

    @property
    def num_macs(self) -> int:
        """Multiply-accumulates per image: every output pixel of each convolution, plus the dense layers."""
        height, width = self.image_shape[:2]
        total = 0
        for conv in self.convs:
            height, width = conv.out_size(height, width)
            total += height * width * conv.out_channels * conv.in_channels * conv.kernel[0] * conv.kernel[1]
        dense = (self.project, *self.head)
        return total + sum(layer.in_dim * layer.out_dim for layer in dense)


def is_image_policy(module: nn.Module) -> bool:
    """Whether ``module`` has the attributes of an ``ImageExportedPolicy`` (PPO's image policy
    and the SAC/FastTD3 image actor both export one)."""
    return all(hasattr(module, attr) for attr in IMAGE_POLICY_ATTRS)


def image_arrays(module: nn.Module) -> ImageArrays:
    """Validate an ``ImageExportedPolicy`` and return its arrays.

    Raises :class:`PolicyArtifactError` naming the layer (``encoder.convs[3] (MaxPool2d)``) for
    anything the description cannot hold, and :class:`NonFiniteError` for a NaN/inf weight."""
    try:
        return _image_arrays(module)
    except (NonFiniteError, PolicyArtifactError):
        raise
    except EmbodiedError as err:  # dense_layers' errors: the same message, the artifact's type
        raise PolicyArtifactError(str(err)) from None


def _image_arrays(module: nn.Module) -> ImageArrays:
    for attr in IMAGE_POLICY_ATTRS:
        if not hasattr(module, attr):
            raise PolicyArtifactError(
                f"{type(module).__name__} has no {attr!r}: not an image policy (ImageExportedPolicy)"
            )
    described = ("encoder.convs", "encoder.project", "net")
    for name, layer in module.named_modules():
        # a weight-carrying layer outside the described parts would be dropped without a word
        inside = any(name == root or name.startswith(root + ".") for root in described)
        if name and not inside and any(True for _ in layer.parameters(recurse=False)):
            raise PolicyArtifactError(
                f"{type(module).__name__} layer {name!r} ({type(layer).__name__}) is outside encoder.convs, "
                "encoder.project and net: an image policy artifact cannot hold it"
            )
    encoder = module.encoder
    if not isinstance(encoder, nn.Module):
        raise PolicyArtifactError(f"encoder must be an nn.Module, got {type(encoder).__name__}")
    image_shape = _image_shape(module.image_shape)
    pixel_scale = float(getattr(encoder, "pixel_scale", math.nan))
    if not (math.isfinite(pixel_scale) and pixel_scale > 0):
        raise PolicyArtifactError(f"encoder.pixel_scale must be a positive number, got {pixel_scale}")
    convs = _conv_layers(getattr(encoder, "convs", None))
    project, norm = _projection(getattr(encoder, "project", None))
    head = dense_layers(module.net, "net")
    mean, std = normalizer_arrays(module, head[0].in_dim - project.out_dim)
    clip = float(module.obs_clip)  # type: ignore[arg-type]  # a float attribute of ImageExportedPolicy
    arrays = ImageArrays(image_shape, pixel_scale, convs, project, norm, mean, std, clip, head)
    check_image_arrays(arrays)
    return arrays


def _image_shape(shape: object) -> tuple[int, int, int]:
    try:
        height, width, channels = (int(v) for v in shape)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise PolicyArtifactError(f"image_shape must be (H, W, C), got {shape!r}") from None
    return height, width, channels


def _conv_layers(convs: object) -> tuple[ConvLayer, ...]:
    """``encoder.convs``: ``Conv2d`` layers, each optionally followed by one activation, then a
    ``Flatten`` last; anything else is named."""
    if not isinstance(convs, nn.Sequential):
        raise PolicyArtifactError(f"encoder.convs must be an nn.Sequential, got {type(convs).__name__}")
    layers: list[ConvLayer] = []
    for index, layer in enumerate(convs):
        where = f"encoder.convs[{index}] ({type(layer).__name__})"
        if isinstance(layer, nn.Conv2d):
            layers.append(_conv_layer(layer, where))
        elif (act := activation_name(layer, SUPPORTED_ACTIVATIONS)) is not None:
            if not layers or layers[-1].activation != "none":
                raise PolicyArtifactError(f"{where}: an activation must directly follow a Conv2d layer")
            alpha = float(getattr(layer, "alpha", 1.0))
            prev = layers[-1]
            layers[-1] = ConvLayer(prev.weight, prev.bias, prev.stride, prev.padding, act, alpha)
        elif not (
            isinstance(layer, nn.Flatten) and index == len(convs) - 1 and (layer.start_dim, layer.end_dim) == (1, -1)
        ):
            supported = ", ".join(["Conv2d", *(t.__name__ for t in SUPPORTED_ACTIVATIONS), "Flatten (last)"])
            raise PolicyArtifactError(
                f"{where} cannot be held by an image policy artifact; supported layers: {supported}"
            )
    if not layers or not isinstance(convs[-1], nn.Flatten):
        raise PolicyArtifactError("encoder.convs must hold at least one Conv2d and end with a Flatten")
    return tuple(layers)


def _conv_layer(layer: nn.Conv2d, where: str) -> ConvLayer:
    if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
        raise PolicyArtifactError(
            f"{where}: only numeric zero padding is supported, got {layer.padding!r} ({layer.padding_mode})"
        )
    if layer.groups != 1 or tuple(layer.dilation) != (1, 1):
        raise PolicyArtifactError(f"{where}: grouped or dilated convolutions are not supported")
    weight = finite_array(f"{where} weight", float32_array(layer.weight))
    bias = (
        finite_array(f"{where} bias", float32_array(layer.bias))
        if layer.bias is not None
        else np.zeros(weight.shape[0], dtype=np.float32)
    )
    stride = (int(layer.stride[0]), int(layer.stride[1]))
    padding = (int(layer.padding[0]), int(layer.padding[1]))
    return ConvLayer(weight, bias, stride, padding, "none")


def _projection(project: object) -> tuple[DenseLayer, LayerNormArrays | None]:
    """``encoder.project``: ``Linear``, then optionally ``LayerNorm``, then optionally one activation."""
    if not isinstance(project, nn.Sequential) or not len(project) or not isinstance(project[0], nn.Linear):
        raise PolicyArtifactError("encoder.project must be an nn.Sequential starting with a Linear layer")
    (dense,) = dense_layers(nn.Sequential(project[0]), "encoder.project")
    norm: LayerNormArrays | None = None
    for index, layer in enumerate(list(project)[1:], start=1):
        where = f"encoder.project[{index}] ({type(layer).__name__})"
        act = activation_name(layer, SUPPORTED_ACTIVATIONS)
        alpha = float(getattr(layer, "alpha", 1.0))
        if isinstance(layer, nn.LayerNorm) and index == 1:
            if tuple(layer.normalized_shape) != (dense.out_dim,) or layer.weight is None or layer.bias is None:
                raise PolicyArtifactError(f"{where}: expected an affine LayerNorm over the {dense.out_dim} features")
            weight = finite_array(f"{where} weight", float32_array(layer.weight))
            bias = finite_array(f"{where} bias", float32_array(layer.bias))
            norm = LayerNormArrays(weight, bias, float(layer.eps), "none")
        elif act is not None and index == len(project) - 1:
            if norm is not None:
                norm = LayerNormArrays(norm.weight, norm.bias, norm.eps, act, alpha)
            else:
                dense = DenseLayer(dense.weight, dense.bias, act, alpha)
        else:
            raise PolicyArtifactError(
                f"{where} cannot be held by an image policy artifact; supported: Linear, then LayerNorm, then "
                f"one of {', '.join(t.__name__ for t in SUPPORTED_ACTIVATIONS)}"
            )
    return dense, norm


def check_image_arrays(arrays: ImageArrays) -> None:
    """Raise :class:`PolicyArtifactError` naming the field whose size does not chain to the next
    (a damaged or hand-edited description), or a value out of range."""
    height, width, channels = arrays.image_shape
    if min(height, width, channels) < 1:
        raise PolicyArtifactError(f"image_shape must be positive (H, W, C), got {arrays.image_shape}")
    if not arrays.convs:
        raise PolicyArtifactError("convs is empty: an image policy has at least one convolution")
    for index, conv in enumerate(arrays.convs):
        where = f"convs[{index}] ({conv.text() if conv.weight.ndim == 4 else 'weight ' + str(conv.weight.shape)})"
        if conv.weight.ndim != 4 or conv.bias.shape != (conv.out_channels,):
            raise PolicyArtifactError(
                f"{where}: weight must be [out, in, kh, kw] and bias [out], got bias {conv.bias.shape}"
            )
        if conv.in_channels != channels:
            raise PolicyArtifactError(f"{where} reads {conv.in_channels} channels but receives {channels}")
        if min(conv.stride) < 1 or min(conv.padding) < 0:
            raise PolicyArtifactError(
                f"{where}: stride must be >= 1 and padding >= 0, got {conv.stride}, {conv.padding}"
            )
        height, width = conv.out_size(height, width)
        if height < 1 or width < 1:
            raise PolicyArtifactError(
                f"{where}: images of {arrays.image_shape[:2]} px are too small for the convolutions"
            )
        channels = conv.out_channels
    flat = channels * height * width
    if arrays.project.in_dim != flat:
        raise PolicyArtifactError(
            f"project reads {arrays.project.in_dim} inputs but the convolutions leave {channels}x{height}x{width} = {flat}"
        )
    norm = arrays.project_norm
    if norm is not None and (norm.weight.shape != (arrays.features,) or norm.bias.shape != (arrays.features,)):
        raise PolicyArtifactError(
            f"project_norm must be [{arrays.features}], got {norm.weight.shape}/{norm.bias.shape}"
        )
    if arrays.obs_mean.shape != arrays.obs_std.shape or arrays.obs_mean.ndim != 1:
        raise PolicyArtifactError(f"obs_mean/obs_std must be [D], got {arrays.obs_mean.shape}/{arrays.obs_std.shape}")
    for index, layer in enumerate(arrays.head):
        expected = arrays.obs_dim + arrays.features if index == 0 else arrays.head[index - 1].out_dim
        if layer.in_dim != expected:
            raise PolicyArtifactError(f"head[{index}] reads {layer.in_dim} inputs but receives {expected}")
    if not arrays.head:
        raise PolicyArtifactError("head is empty: an image policy ends with at least one Linear layer")
    if math.isnan(arrays.obs_clip) or arrays.obs_clip <= 0:
        raise PolicyArtifactError(f"obs_clip must be positive (or inf), got {arrays.obs_clip}")


def build_image(arrays: ImageArrays) -> nn.Module:
    """The float32 CPU ``ImageExportedPolicy`` whose :func:`image_arrays` is ``arrays``:
    ``(obs [B, D], image [B, H, W, C] uint8) -> action [B, A]``, with the same submodule names
    as the module it was described from."""
    from embodied.policies.cnn import ImageEncoder, ImageExportedPolicy

    check_image_arrays(arrays)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.float32))

    try:
        convs: list[nn.Module] = []
        for index, conv in enumerate(arrays.convs):
            layer = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel, conv.stride, conv.padding)
            layer.load_state_dict({"weight": tensor(conv.weight), "bias": tensor(conv.bias)})
            convs.append(layer)
            if conv.activation != "none":
                convs.append(activation_module(conv.activation, conv.elu_alpha, f"convs[{index}]"))
        convs.append(nn.Flatten())
        project: list[nn.Module] = list(sequential_from_layers((arrays.project,), "project"))
        norm = arrays.project_norm
        if norm is not None:
            layer_norm = nn.LayerNorm(arrays.features, eps=norm.eps)
            layer_norm.load_state_dict({"weight": tensor(norm.weight), "bias": tensor(norm.bias)})
            project.append(layer_norm)
            if norm.activation != "none":
                project.append(activation_module(norm.activation, norm.elu_alpha, "project_norm"))
        head = sequential_from_layers(arrays.head, "head")
    except PolicyArtifactError:
        raise
    except (EmbodiedError, RuntimeError) as err:  # an unknown activation; load_state_dict: a wrong shape
        raise PolicyArtifactError(f"image policy description: {err}") from None
    encoder = ImageEncoder(
        arrays.image_shape,
        arrays.features,
        layers=(nn.Sequential(*convs), nn.Sequential(*project)),
        pixel_scale=arrays.pixel_scale,
    )
    return ImageExportedPolicy(encoder, head, tensor(arrays.obs_mean), tensor(arrays.obs_std), arrays.obs_clip)
