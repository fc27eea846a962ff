"""ONNX export of an image-instruction flow policy (``policies/image_flow.py``), and why C cannot hold one.

The exported graph is the policy's :class:`~embodied.policies.image_flow.ImageInstructionSampler` traced with
torch's TorchScript exporter (:func:`embodied.export.onnx_traced.export_traced_inputs`). Its inputs,
by name and in order: ``image`` ``[B, H, W, 3]`` uint8 (only when the policy has a camera
encoder), ``instruction_embedding`` ``[B, E]`` float32 (the instruction is an input, not a
constant: a deployment embeds its instruction once with :mod:`embodied.policies.text_embedding`
and feeds it every step), ``proprio`` ``[B, D]`` float32; the output ``action`` is the chunk
``[B, H_a, A]`` in [-1, 1]. onnxruntime must match torch to :data:`embodied.export.onnx.PARITY_TOL`.

The C exporter writes one MLP over one observation vector; :func:`c_unsupported_layer` names
the first layer of an image-instruction sampler that it has no code for (a convolution, the flow head's Mish,
...), for the refusal message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.onnx import OnnxExport
from embodied.export.onnx_traced import export_traced_inputs

log = logging.getLogger(__name__)

C_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Tanh, nn.ELU, nn.ReLU)
"""Layers the C exporter has code for (``embodied.export.c_header``)."""


def c_unsupported_layer(module: nn.Module) -> str:
    """``"name (Type)"`` of ``module``'s first leaf layer the C exporter cannot write, or ``""``."""
    for name, layer in module.named_modules():
        if not list(layer.children()) and not isinstance(layer, C_LAYERS):
            return f"{name} ({type(layer).__name__})"
    return ""


def refuse_c_export(module: nn.Module) -> EmbodiedError:
    """The error ``--format c`` gives for an image-instruction sampler, naming the layer (and the inputs)."""
    layer = c_unsupported_layer(module)
    names = ", ".join(getattr(module, "input_names", ("?",)))
    what = f"its layer {layer} has no C code" if layer else "the C exporter writes one MLP over one observation vector"
    return EmbodiedError(
        f"format 'c' cannot hold an image-instruction flow policy ({type(module).__name__}, inputs {names}): {what}; "
        "export it with --format onnx"
    )


def export_image_instruction_onnx(module: nn.Module, export_dir: Path, probes: Mapping[str, np.ndarray]) -> OnnxExport:
    """Trace ``module`` (a ``ImageInstructionSampler``) to ``export_dir/policy.onnx``; check onnxruntime against
    torch on ``probes`` (input name -> ``[N, ...]`` array, one per name in ``module.input_names``)."""
    names: tuple[str, ...] = tuple(getattr(module, "input_names", ()))
    missing = [n for n in names if n not in probes]
    if not names or missing:
        raise EmbodiedError(f"image-instruction export needs probe inputs {list(names)}; missing {missing}")
    examples = {n: torch.from_numpy(np.ascontiguousarray(probes[n][:2])) for n in names}
    return export_traced_inputs(module, examples, export_dir, {n: probes[n] for n in names})
