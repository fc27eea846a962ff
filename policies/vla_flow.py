"""Deprecated name of :mod:`embodied.policies.image_flow` (importing it warns).

The from-scratch image + instruction flow policy is not a vision-language-action model, so it
was renamed: ``VLAFlowPolicy`` is :class:`~embodied.policies.image_flow.ImageInstructionFlowPolicy`,
``VLASampler`` is :class:`~embodied.policies.image_flow.ImageInstructionSampler`.
"""

import warnings

from embodied.policies.image_flow import ImageInstructionFlowPolicy, ImageInstructionSampler, make_flow_policy

warnings.warn(
    "embodied.policies.vla_flow is deprecated: import embodied.policies.image_flow "
    "(VLAFlowPolicy -> ImageInstructionFlowPolicy, VLASampler -> ImageInstructionSampler)",
    DeprecationWarning,
    stacklevel=2,
)

VLAFlowPolicy = ImageInstructionFlowPolicy
VLASampler = ImageInstructionSampler

__all__ = ["VLAFlowPolicy", "VLASampler", "make_flow_policy"]
