"""A small image + instruction flow policy: image encoder + instruction embedding + proprioception -> chunk.

Trained from scratch, it has the inputs of a vision-language-action policy but none of its
pretrained vision-language backbone, so it is not one (LeRobot's pretrained VLAs run through
:mod:`embodied.policies.vla`); it is sized for a CPU: a camera image goes
through a small CNN encoder, the instruction through a word-embedding model shipped inside a
package (:mod:`embodied.policies.text_embedding`) and a learned projection, the proprioceptive
``policy`` group through the frozen dataset normalizer; their concatenation conditions the
flow-matching action head of :class:`~embodied.policies.flow.FlowPolicy` (same velocity
network, sampler, chunks and losses). So ``bc-flow`` trains it, and ReinFlow, residual RL and
offline-to-online fine-tune it like any flow policy: they all reach the observation through
:meth:`FlowPolicy.condition`.

The instruction's embedding ``[E]`` is computed once (when the policy is built) and kept as a
buffer, so checkpoints carry it and acting never calls the text model. The exported graph takes
it as an input (``instruction_embedding [B, E]``) beside the image and the proprioception, so a
deployment can change the instruction without a new export (it embeds the new one once).

Shapes: ``B`` = batch, ``H, W`` = image size, ``D`` = proprioception size, ``E`` = instruction
embedding size, ``T`` = text features, ``I`` = image features, ``C = I + T + D``, ``H_a`` =
chunk length, ``A`` = action size.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch
from torch import nn

from embodied.config import ConfigError
from embodied.env import IMAGE_GROUP, ObsDict
from embodied.policies.cnn import ImageEncoder
from embodied.policies.flow import OBS_CLIP, FlowPolicy, FlowPolicyCfg, FlowSampler
from embodied.policies.text_embedding import embed_instruction

TEXT_FEATURES = 16
"""``T``: width of the learned projection of the instruction embedding."""
IMAGE_FEATURES = 64
"""``I``: width of the camera encoder's output (:class:`embodied.policies.cnn.ImageEncoder`)."""


class ImageInstructionFlowPolicy(FlowPolicy):
    """Flow-matching policy conditioned on ``[image features, text features, normalized proprio]``.

    ``encoder`` is None for a policy without a camera (the instruction and proprioception only).
    ``instruction_embedding [E]``: the instruction's embedding (see the module docstring).
    """

    instruction_embedding: torch.Tensor

    def __init__(
        self,
        proprio_dim: int,
        action_dim: int,
        cfg: FlowPolicyCfg,
        instruction_embedding: torch.Tensor,
        encoder: ImageEncoder | None = None,
    ) -> None:
        if instruction_embedding.dim() != 1:
            raise ConfigError(
                f"the instruction embedding must be one vector [E], got {tuple(instruction_embedding.shape)}"
            )
        image_dim = 0 if encoder is None else int(encoder.features)
        super().__init__(proprio_dim, action_dim, cfg, cond_dim=image_dim + TEXT_FEATURES + proprio_dim)
        self.encoder = encoder
        self.text_proj = nn.Linear(instruction_embedding.shape[0], TEXT_FEATURES)
        self.register_buffer("instruction_embedding", instruction_embedding.detach().clone().float())

    def condition(self, obs: ObsDict | torch.Tensor) -> torch.Tensor:
        """``[B, C]`` from the observation dict (``image`` needed when the policy has an encoder)."""
        if isinstance(obs, torch.Tensor):
            if self.encoder is not None:
                raise ConfigError(
                    "this image-instruction policy sees camera images: give it the observation dict, not a tensor"
                )
            proprio = obs
        else:
            proprio = obs["policy"]
        b = proprio.shape[0]
        text = self.text_proj(self.instruction_embedding).expand(b, -1)
        parts = [text, self.normalize(proprio)]
        if self.encoder is not None:
            if not isinstance(obs, dict) or IMAGE_GROUP not in obs:
                raise ConfigError(
                    f"this image-instruction policy sees camera images: the observation has no {IMAGE_GROUP!r} group "
                    "(run the task with a camera)"
                )
            parts.insert(0, self.encoder(obs[IMAGE_GROUP]))
        return torch.cat(parts, dim=-1)

    def export_module(self) -> ImageInstructionSampler:
        return ImageInstructionSampler(self)


class ImageInstructionSampler(nn.Module):
    """The deterministic sampler with its encoders, one graph (a deep copy of the policy's parts).

    ``forward(image [B, H, W, 3] uint8, instruction_embedding [B, E] float32, proprio [B, D]
    float32) -> chunk [B, H_a, A]`` in [-1, 1]; without an encoder ``forward(instruction_embedding,
    proprio)``. :attr:`input_names` lists the inputs in order (the ONNX graph's names).
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    instruction_embedding: torch.Tensor

    def __init__(self, policy: ImageInstructionFlowPolicy) -> None:
        super().__init__()
        self.encoder = None if policy.encoder is None else copy.deepcopy(policy.encoder).eval()
        self.text_proj = copy.deepcopy(policy.text_proj).eval()
        self.head = FlowSampler.from_policy(policy)
        self.register_buffer("obs_mean", policy.obs_mean.detach().clone())
        self.register_buffer("obs_std", policy.obs_std.detach().clone())
        self.register_buffer("instruction_embedding", policy.instruction_embedding.detach().clone())
        """The training instruction's embedding, for callers that keep it (the graph takes it as input)."""
        self.obs_clip = OBS_CLIP
        self.proprio_dim = policy.obs_dim
        self.input_names: tuple[str, ...] = (
            ("instruction_embedding", "proprio")
            if self.encoder is None
            else ("image", "instruction_embedding", "proprio")
        )
        self.embed_dim = int(policy.instruction_embedding.shape[0])
        self.chunk = policy.cfg.chunk
        self.exec_steps = policy.cfg.exec_steps

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.input_names):
            raise ConfigError(f"ImageInstructionSampler takes {', '.join(self.input_names)}; got {len(inputs)} inputs")
        *image, embedding, proprio = inputs
        proprio_n = ((proprio - self.obs_mean) / self.obs_std).clamp(-self.obs_clip, self.obs_clip)
        parts = [self.text_proj(embedding), proprio_n]
        if self.encoder is not None:
            parts.insert(0, self.encoder(image[0]))
        return self.head.integrate(torch.cat(parts, dim=-1))


def make_flow_policy(obs_spec: Mapping[str, tuple[int, ...]], action_dim: int, cfg: FlowPolicyCfg) -> FlowPolicy:
    """The flow policy ``cfg`` describes for an env's ``obs_spec``: a :class:`ImageInstructionFlowPolicy` when
    ``cfg.instruction`` is set (the text model runs once here; with a camera encoder when the env
    renders images), else a plain :class:`FlowPolicy` (which ignores any images)."""
    proprio_dim = int(math.prod(obs_spec["policy"]))
    if not cfg.instruction:
        return FlowPolicy(proprio_dim, action_dim, cfg)
    encoder = ImageEncoder(obs_spec[IMAGE_GROUP], IMAGE_FEATURES) if IMAGE_GROUP in obs_spec else None
    return ImageInstructionFlowPolicy(proprio_dim, action_dim, cfg, embed_instruction(cfg.instruction), encoder)
